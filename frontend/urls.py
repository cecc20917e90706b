"""Portal pages: jobs (list, submit, page, logs download), queues, teams, images, GPUs, login and language."""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.i18n import set_language

from frontend import views

app_name = "frontend"

urlpatterns = [
    path("", views.home, name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="frontend/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="frontend:login"), name="logout"),
    path("i18n/setlang/", set_language, name="set-language"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/states.json", views.job_states, name="job-states"),
    path("jobs/new/", views.job_submit, name="job-submit"),
    path("jobs/compare/", views.job_compare, name="job-compare"),
    path("jobs/cancel/", views.job_bulk_cancel, name="job-bulk-cancel"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<uuid:job_id>/live/", views.job_live, name="job-live"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<uuid:job_id>/reproduce/", views.job_reproduce, name="job-reproduce"),
    path("jobs/<uuid:job_id>/retry/", views.job_retry, name="job-retry"),
    path("jobs/<uuid:job_id>/job.yaml", views.job_yaml, name="job-yaml"),
    path("jobs/new/import/", views.job_import, name="job-import"),
    path("jobs/<uuid:job_id>/logs/download/", views.job_log_download, name="job-log-download"),
    path("experiments/", views.experiment_list, name="experiment-list"),
    path("experiments/new/", views.experiment_create, name="experiment-create"),
    path("experiments/<uuid:experiment_id>/", views.experiment_detail, name="experiment-detail"),
    path("experiments/<uuid:experiment_id>/rerun/", views.experiment_rerun, name="experiment-rerun"),
    path("experiments/<uuid:experiment_id>/<slug:command>/", views.experiment_command, name="experiment-command"),
    path("templates/", views.template_list, name="template-list"),
    path("templates/<int:template_id>/edit/", views.template_edit, name="template-edit"),
    path("templates/<int:template_id>/delete/", views.template_delete, name="template-delete"),
    path("tokens/", views.token_list, name="token-list"),
    path("settings/notifications/", views.push_settings, name="push-settings"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    path("queues/", views.queue_list, name="queue-list"),
    path("queues/<slug:name>/", views.queue_detail, name="queue-detail"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("images/", views.image_list, name="image-list"),
    path("images/<str:kind>/<int:pk>/build/", views.image_build, name="image-build"),
    path("images/builds/<int:pk>/", views.image_build_detail, name="image-build-detail"),
    path("datasets/", views.dataset_list, name="dataset-list"),
    path("gpus/", views.gpu_list, name="gpu-list"),
]
