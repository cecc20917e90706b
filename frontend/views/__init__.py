"""Portal page views: they call the same selectors and services as the API, and render templates.

Reads go through `jobs.selectors` / `quotas.selectors` (so a user sees exactly what the API shows them),
writes through `jobs.services` inside one durable transaction, like the API's actions.
"""

# ruff: noqa: F401 - the package re-exports its modules' names
from frontend.views.catalog import dataset_list, gpu_list, image_build, image_build_detail, image_list
from frontend.views.common import (
    JOBS_PER_PAGE,
    LOG_DOWNLOAD_PAGE,
    LOG_TAIL,
    MAX_POLLED_JOBS,
    home,
    portal_runtime,
    recommendation_message,
    visible_job,
)
from frontend.views.compare import job_compare
from frontend.views.job_list import job_list, job_states
from frontend.views.job_page import (
    CHECKPOINT_WARNINGS,
    job_bulk_cancel,
    job_cancel,
    job_detail,
    job_live,
    job_log_download,
    job_reproduce,
    job_retry,
)
from frontend.views.queues import LINE_SHOWN, MINE_SHOWN, queue_detail, queue_list
from frontend.views.submit import job_submit, template_delete, template_edit, template_list
from frontend.views.teams import team_detail, team_list
from frontend.views.tokens import token_list, token_revoke
