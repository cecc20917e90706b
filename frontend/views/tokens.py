"""Tokens: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache

from quotas import tokens
from quotas.models import TOKEN_SCOPES, ApiToken


def _token_rows(user) -> list[dict[str, Any]]:
    now = timezone.now()
    rows = []
    for token in ApiToken.objects.filter(user=user).order_by("-created_at"):
        if token.revoked_at is not None:
            status = "revoked"
        elif token.expires_at is not None and token.expires_at <= now:
            status = "expired"
        else:
            status = "active"
        rows.append({"token": token, "status": status})
    return rows


@never_cache
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """The user's API tokens; POST makes one, whose secret this response shows once (never stored, never again)."""
    created = None
    errors: dict[str, str] = {}
    values = {"name": "", "expires_in_days": "", "scopes": ["read", "submit"]}
    status = 200
    if request.method == "POST":
        values = {
            "name": request.POST.get("name", "").strip(),
            "expires_in_days": request.POST.get("expires_in_days", "").strip(),
            "scopes": request.POST.getlist("scopes"),
        }
        days: int | None = None
        if not values["name"]:
            errors["name"] = _("Give the token a name, e.g. the pipeline that will use it.")
        elif len(values["name"]) > 100:
            errors["name"] = _("At most 100 characters.")
        if values["expires_in_days"]:
            try:
                days = int(values["expires_in_days"])
                if not 1 <= days <= 3650:
                    raise ValueError
            except ValueError:
                errors["expires_in_days"] = _("A whole number of days between 1 and 3650, or empty for no expiry.")
        if not values["scopes"] or set(values["scopes"]) - set(TOKEN_SCOPES):
            errors["scopes"] = _("Pick at least one of read, submit and admin.")
        if not errors:
            with transaction.atomic(durable=True):
                token, raw = tokens.token_create(
                    user=request.user, name=values["name"], expires_in_days=days, scopes=values["scopes"]
                )
            created = {"token": token, "raw": raw}
            values = {"name": "", "expires_in_days": "", "scopes": ["read", "submit"]}
        else:
            status = 400
    return render(
        request,
        "frontend/token_list.html",
        {
            "nav": "tokens",
            "rows": _token_rows(request.user),
            "created": created,
            "errors": errors,
            "values": values,
            "scopes": TOKEN_SCOPES,
            "api_url": request.build_absolute_uri("/").rstrip("/"),
        },
        status=status,
    )


@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """GET asks for confirmation, POST revokes (the token stops working at once)."""
    if token_id > 2**31 - 1:
        raise Http404("no such token")
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    if request.method == "POST":
        with transaction.atomic(durable=True):
            tokens.token_revoke(token=token)
        messages.success(
            request, _("Revoked token %(name)s (%(prefix)s).") % {"name": token.name, "prefix": token.prefix}
        )
        return redirect("frontend:token-list")
    return render(request, "frontend/token_revoke.html", {"nav": "tokens", "token": token})
