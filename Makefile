# The two commands of the README. Both install missing build packages first (scripts/setup.sh).
CARGO ?= cargo

.PHONY: demo test setup

setup:
	@scripts/setup.sh

# The main job: the parameter-server benchmark over each transport, side by side.
demo: setup
	$(CARGO) run --release -p bx -- ps bench

# Every test: set-up, host build, host tests, then the ibverbs tests inside the Soft-RoCE VM
# (BX_ALLOW_SKIP=vm skips the VM part, loudly); ends with a line `N passed, M failed`.
test:
	@scripts/test.sh
