"""Portal page views: they call the same selectors and services as the API, and render templates.

Reads go through `jobs.selectors` / `quotas.selectors` (so a user sees exactly what the API shows them),
writes through `jobs.services` inside one durable transaction, like the API's actions.
"""

# ruff: noqa: F401 - what the rest of the platform reads of this package (each module is importable too)
from frontend.views.catalog import dataset_list, gpu_list, image_build, image_build_detail, image_list
from frontend.views.common import home
from frontend.views.compare import job_compare
from frontend.views.experiments import (
    experiment_command,
    experiment_create,
    experiment_detail,
    experiment_list,
    experiment_rerun,
)
from frontend.views.job_list import job_list, job_states
from frontend.views.job_page import (
    job_bulk_cancel,
    job_cancel,
    job_detail,
    job_live,
    job_log_download,
    job_reproduce,
    job_retry,
    job_yaml,
)
from frontend.views.push import push_settings
from frontend.views.queues import queue_detail, queue_list
from frontend.views.submit import job_import, job_submit, template_delete, template_edit, template_list
from frontend.views.teams import team_detail, team_list
from frontend.views.tokens import token_list, token_revoke
