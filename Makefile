# Trainyard: `make run` starts the platform, `make test` runs the test suite.
BIN := .venv/bin
PYTEST_ARGS ?=

.PHONY: run test test-faults test-k8s test-gpu venv lint fmt migrations web worker dispatcher beat smoke-embedded smoke-installed bench bench-api bench-allocator bench-scheduler bench-eta bench-pools bench-logs bench-rightsizing bench-storage bench-experiments bench-k8s bench-submit bench-soak bench-inventory lock

venv: .venv/.installed
.venv/.installed: requirements.txt requirements-dev.txt pyproject.toml scripts/bootstrap.sh scripts/system-packages.sh
	@scripts/bootstrap.sh

run: venv
	@scripts/system-packages.sh
	@$(BIN)/python -m ops.standalone

# The bulk of the suite in two parallel workers, then the fault suite and the browser tests alone (scripts/test.sh).
test: venv
	@scripts/system-packages.sh
	@$(BIN)/python -m ops.embedded exec -- scripts/test.sh $(PYTEST_ARGS)

# The fault suite alone (also part of `make test`): real processes, PostgreSQL and Redis stopped and started.
test-faults: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m pytest -m faults $(PYTEST_ARGS) tests/faults

# The Volcano backend against the real control plane of `make cluster` (also part of `make test`).
test-k8s: venv
	@$(BIN)/python scripts/cluster/cluster.py build
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m pytest -m k8s $(PYTEST_ARGS) tests/k8s

# Real-GPU checks (NVML inventory and collector, CUDA jobs on the cards they were placed on); skipped without a GPU.
test-gpu: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m pytest -m gpu -s jobs/tests/test_real_gpu.py

# The embedded path on its own: no DATABASE_URL/REDIS_URL/TRAINYARD_S3_URL/TRAINYARD_REGISTRY_URL, servers started from the
# wheels (the image registry from Debian's docker-registry) in a scratch var/.
smoke-embedded: venv
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && env -u DATABASE_URL -u REDIS_URL -u TRAINYARD_S3_URL -u TRAINYARD_REGISTRY_URL TRAINYARD_VAR_DIR=$$d \
	  $(BIN)/python -m ops.embedded exec -- $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_smoke_embedded.py

# Style, then the layering contracts of pyproject.toml ([tool.importlinter]; README "Where things live").
# The platform installed the way the Dockerfile installs it (a plain, non-editable `pip install .`), run from outside
# the checkout: the installed copy must hold everything the embedded smoke needs (templates, translations, the CLI).
smoke-installed: venv
	@scripts/smoke-installed.sh

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports --no-cache

fmt: venv
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

migrations: venv
	$(BIN)/python manage.py makemigrations

web worker dispatcher beat: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m ops.processes $@

bench: bench-allocator bench-scheduler bench-eta bench-pools bench-api bench-logs bench-rightsizing bench-storage bench-experiments

bench-allocator: venv
	$(BIN)/python -m bench.allocator $(ARGS)

# The live dispatch path on the trace's whole cluster (real PostgreSQL, job_submit, the dispatcher, a worker).
bench-scheduler: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.scheduler $(ARGS)

# Estimated starts against real starts: trace windows replayed through the real dispatcher on simulated time.
# The Volcano backend on a real control plane with the trace's whole cluster as kwok nodes, against a floor of the
# same Volcano jobs created directly (bench/k8s.py; `--quick` through BENCH_ARGS). Not part of `make bench`.
bench-k8s: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.k8s $(BENCH_ARGS)

# The Volcano backend's inventory sync on the trace's whole cluster: seconds and queries (bench/inventory.py).
bench-inventory: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.inventory $(BENCH_ARGS)

bench-eta: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.eta $(ARGS)

# Preemptible borrowing against quota-holding work: trace windows through the real dispatcher and preemption.
bench-pools: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.pools $(ARGS)

bench-api: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.api $(ARGS)

bench-logs: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.logs $(ARGS)

# Right-sizing: recommendations replayed on profiles recorded from real local jobs (docs/rightsizing.md).
bench-rightsizing: venv
	$(BIN)/python -m bench.rightsizing $(ARGS)

bench-storage: venv
	@$(BIN)/python -m bench.storage $(ARGS)

# Submission on a 100,000-job database next to a minimal authenticated GET, through the real web server and workers
# (bench/submit.py; ARGS=--keep-db keeps the database for the next run). Not part of `make bench`.
bench-submit: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.submit $(ARGS)

# An hour of submissions, reads and cancels through the processes `make run` starts: RSS of each, every minute.
bench-soak: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.soak $(ARGS)

# ASHA vs random search through the real platform (worker, beat, sandboxed trials); ARGS=--quick for a short run.
bench-experiments: venv
	@$(BIN)/python -m ops.embedded exec -- $(BIN)/python -m bench.experiments $(ARGS)

# Re-pin both locks after editing requirements.in (runtime) or requirements-dev.in (tools).
lock:
	@scripts/lock.sh

# A real Kubernetes control plane on loopback for the Volcano backend (docs/cluster.md): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, Volcano and kwok GPU nodes, built from their Go modules on first use.
.PHONY: cluster cluster-stop cluster-status cluster-smoke
cluster: venv
	@$(BIN)/python scripts/cluster/cluster.py up

cluster-stop:
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) scripts/cluster/cluster.py down

cluster-status:
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) scripts/cluster/cluster.py status

cluster-smoke: venv
	@$(BIN)/python scripts/cluster/smoke.py
