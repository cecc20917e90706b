"""Push settings: part of `frontend.views` (see its package docstring). Where the user's failed attempts are pushed
besides the portal: a signed webhook and an email address (the same service as the API)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache

from kernel.errors import ValidationFailed
from monitoring.models import Notification, PushSettings
from monitoring.services import push_settings_save


@never_cache
@login_required
def push_settings(request: HttpRequest) -> HttpResponse:
    current = PushSettings.objects.filter(user=request.user).first()
    values = {"webhook_url": current.webhook_url if current else "", "email": current.email if current else ""}
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        values = {"webhook_url": request.POST.get("webhook_url", "").strip(), "email": request.POST.get("email", "")}
        data = dict(values)
        secret = request.POST.get("webhook_secret", "")
        if secret or not (current and current.webhook_secret):
            data["webhook_secret"] = secret  # an empty box keeps the secret already set
        try:
            push_settings_save(user=request.user, data=data)
        except ValidationFailed as exc:
            errors[exc.field or "webhook_url"] = exc.detail
            status = 400
        else:
            messages.success(request, _("Your notification settings are saved."))
            return redirect("frontend:push-settings")
    notes = list(Notification.objects.filter(user=request.user).select_related("alert")[:20])
    return render(
        request,
        "frontend/push_settings.html",
        {
            "nav": "push",
            "values": values,
            "errors": errors,
            "has_secret": bool(current and current.webhook_secret),
            "notes": notes,
        },
        status=status,
    )
