"""`manage.py staff add|remove|list|token`: staff users' roles and their admin API tokens."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from staff.models import AdminToken
from staff.roles import Role, role_assign, role_of, role_remove
from staff.tokens import admin_token_create, admin_token_list, admin_token_revoke


def token_as_dict(token: AdminToken) -> dict[str, Any]:
    return {
        "id": token.pk,
        "user": token.user.get_username(),
        "name": token.name,
        "prefix": token.prefix,
        "created_at": token.created_at.isoformat(),
        "last_used_at": token.last_used_at.isoformat() if token.last_used_at else None,
        "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
    }


class Command(BaseCommand):
    help = "Give staff users a role (viewer, operator, admin), list them, mint their API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        add = actions.add_parser("add", help="Give a user a role (made staff; created if new).")
        add.add_argument("username")
        add.add_argument("--role", choices=[r.value for r in Role], required=True)
        add.add_argument("--email", default="", help="For a user created now.")
        remove = actions.add_parser("remove", help="Take a user's role and staff mark.")
        remove.add_argument("username")
        listing = actions.add_parser("list", help="Staff users, their roles and tokens.")
        token = actions.add_parser("token", help="Admin API tokens: create, list, revoke.")
        token_actions = token.add_subparsers(dest="token_action", required=True, metavar="ACTION")
        create = token_actions.add_parser("create", help="Mint a token; prints it once.")
        create.add_argument("username")
        create.add_argument("--name", default="default")
        token_list = token_actions.add_parser("list", help="Tokens (of one user).")
        token_list.add_argument("username", nargs="?")
        revoke = token_actions.add_parser("revoke", help="Revoke a token by its id.")
        revoke.add_argument("token_id", type=int)
        for sub in (add, remove, listing, create, token_list, revoke):
            sub.add_argument("--json", action="store_true", help="Print JSON for scripts.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "token":
            action = f"token_{options['token_action']}"
        getattr(self, f"_{action}")(options)

    def _user(self, username: str) -> Any:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user '{username}'.")
        return user

    def _add(self, options: dict[str, Any]) -> None:
        users = get_user_model().objects
        user = users.filter(username=options["username"]).first()
        created = user is None
        if user is None:
            user = users.create_user(options["username"], options["email"], is_staff=True)
        role_assign(user=user, role=Role(options["role"]))
        if options["json"]:
            self._print_json({"user": user.get_username(), "role": role_of(user)})
            return
        self.stdout.write(self.style.SUCCESS(f"{user.get_username()} is {role_of(user)}."))
        if created:
            self.stdout.write(
                f"Created without a password: `manage.py changepassword {user.get_username()}` "
                "for the console, `staff token create` for the admin API."
            )

    def _remove(self, options: dict[str, Any]) -> None:
        user = self._user(options["username"])
        role_remove(user=user)
        if options["json"]:
            self._print_json({"user": user.get_username(), "role": None})
            return
        self.stdout.write(self.style.SUCCESS(f"{user.get_username()} is no longer staff."))

    def _list(self, options: dict[str, Any]) -> None:
        users = get_user_model().objects.filter(is_staff=True).order_by("username")
        rows = [
            {
                "user": user.get_username(),
                "role": role_of(user),
                "active": user.is_active,
                "tokens": user.admin_tokens.filter(revoked_at__isnull=True).count(),
            }
            for user in users
        ]
        if options["json"]:
            self._print_json(rows)
            return
        self._print_table(("user", "role", "active", "tokens"), [list(r.values()) for r in rows])

    def _token_create(self, options: dict[str, Any]) -> None:
        user = self._user(options["username"])
        issued = admin_token_create(user=user, name=options["name"])
        if options["json"]:
            self._print_json({**token_as_dict(issued.token), "token": issued.raw_token})
            return
        self.stdout.write(
            self.style.SUCCESS(f"Created token {issued.token.pk} for {user.get_username()}:")
        )
        self.stdout.write(f"  {issued.raw_token}")
        self.stdout.write(self.style.WARNING("Store it now: it is not shown again."))

    def _token_list(self, options: dict[str, Any]) -> None:
        user = self._user(options["username"]) if options["username"] else None
        tokens = list(admin_token_list(user=user))
        if options["json"]:
            self._print_json([token_as_dict(t) for t in tokens])
            return
        rows = [
            (
                t.pk,
                t.user.get_username(),
                t.prefix + "…",
                t.name,
                t.created_at.strftime("%Y-%m-%d %H:%M"),
                t.last_used_at.strftime("%Y-%m-%d %H:%M") if t.last_used_at else "-",
                "revoked" if t.is_revoked else "active",
            )
            for t in tokens
        ]
        self._print_table(("id", "user", "prefix", "name", "created", "last used", "state"), rows)

    def _token_revoke(self, options: dict[str, Any]) -> None:
        token = admin_token_list().filter(pk=options["token_id"]).first()
        if token is None:
            raise CommandError(f"No token {options['token_id']}.")
        admin_token_revoke(token=token)
        if options["json"]:
            self._print_json(token_as_dict(token))
            return
        self.stdout.write(self.style.SUCCESS(f"Revoked token {token.pk} ({token.prefix}…)."))

    def _print_json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2))

    def _print_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        cells = [["-" if v is None else str(v) for v in row] for row in rows]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        self.stdout.write(
            "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))
        )
        for row in cells:
            self.stdout.write(
                "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            )
        if not rows:
            self.stdout.write("(none)")
