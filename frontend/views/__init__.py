"""Portal page views: they call the same selectors and services as the API, and render templates.

Reads go through `jobs.selectors` / `quotas.selectors` (so a user sees exactly what the API shows them),
writes through `jobs.services` inside one durable transaction, like the API's actions.
"""

from frontend.views.catalog import dataset_list, gpu_list, image_build, image_build_detail, image_list  # noqa: F401
from frontend.views.common import (  # noqa: F401
    JOBS_PER_PAGE,
    LOG_DOWNLOAD_PAGE,
    LOG_TAIL,
    MAX_POLLED_JOBS,
    home,
    portal_runtime,
    recommendation_message,
    visible_job,
)
from frontend.views.compare import _parameter_label, job_compare  # noqa: F401
from frontend.views.job_list import _cursor, _keyset_page, _parse_cursor, job_list, job_states  # noqa: F401
from frontend.views.job_page import (  # noqa: F401
    CHECKPOINT_WARNINGS,
    _again,
    _checkpoint_context,
    _gib,
    _in_threads,
    _live_context,
    _log_pages,
    _log_strings,
    _reproduce_rows,
    _usage_context,
    _without,
    job_bulk_cancel,
    job_cancel,
    job_detail,
    job_live,
    job_log_download,
    job_reproduce,
    job_retry,
)
from frontend.views.queues import LINE_SHOWN, MINE_SHOWN, queue_detail, queue_list  # noqa: F401
from frontend.views.submit import (  # noqa: F401
    _card_mib,
    _prefill,
    _render_form,
    _save_template,
    _serializer_errors,
    _submit,
    _submit_choices,
    _submit_defaults,
    _template_error,
    _visible_template,
    job_submit,
    template_delete,
    template_edit,
    template_list,
)
from frontend.views.teams import _team_rightsizing, team_detail, team_list  # noqa: F401
from frontend.views.tokens import _token_rows, token_list, token_revoke  # noqa: F401
