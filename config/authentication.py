"""Authentication of staff for the admin API. Loaded by DRF's settings: keep imports light."""

from rest_framework.authentication import TokenAuthentication


class StaffBearerTokenAuthentication(TokenAuthentication):
    """Staff tokens for the admin API, also accepted as `Authorization: Bearer <token>`."""

    keyword = "Bearer"
