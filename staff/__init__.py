"""Staff: the roles a staff user holds (viewer, operator, admin, as Django groups of the
permissions below) and the admin API's tokens, stored as digests."""
