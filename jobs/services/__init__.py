"""Every change of a job's state: submit, transition, dispatch (admission + placement), resubmit and reproduce.
The attempt lifecycle (start, observe, finish, cancel, time out, reconcile) lives in `jobs.lifecycle`.

`job_transition` is the only writer of `Job.state`. Dispatch runs under the pool lock with the queue and
team rows locked, so concurrent submissions can never over-admit a hard quota.
"""

from jobs.services.common import ENV_NAME, RESERVED_ENV_PREFIXES, InvalidTransition, log  # noqa: F401
from jobs.services.rerun import (  # noqa: F401
    _clone_data,
    _enqueue_start,
    _resume_data,
    job_reproduce,
    job_resubmit,
    job_submission_data,
)
from jobs.services.submission import (  # noqa: F401
    FIELD_ORDER,
    MAX_WATCHES,
    Resolved,
    _command,
    _gpu_models,
    _mig_request,
    _name,
    _preemptible,
    _Problems,
    _reference_card_mib,
    _registry_of,
    _resolve_image,
    _resume_from,
    _same_batch_or_conflict,
    _same_request_or_conflict,
    _validate_env,
    _validate_watch,
    _whole,
    field_rank,
    job_batch_submit,
    job_submit,
    job_validate,
    request_fingerprint,
)
from jobs.services.templates import (  # noqa: F401
    TEMPLATE_LABEL,
    TEMPLATE_NAME,
    _check_fields,
    _editable,
    _template_body,
    _template_name,
    _template_name_free,
    may_edit_template,
    template_create,
    template_delete,
    template_submit,
    template_update,
)
from jobs.services.transitions import _broadcast, _release, event_record, job_transition  # noqa: F401
