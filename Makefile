# One task runner for people and CI (.ci/run calls `make check` and `make test`).
CARGO ?= cargo

.PHONY: all build demo test check fmt clippy pure deny deny-advisories bench install pydeps

all: build

build:
	$(CARGO) build --workspace --bins

# README command 1: a local cluster of real systemd nodes, a guided tour, torn down at the end.
demo:
	$(CARGO) run --release -p drover-sandbox -- demo

# README command 2: unit tests and integration tests on real systemd nodes.
# The integration tests start the daemons from target/debug, so build the binaries first.
test: build pydeps
	$(CARGO) test --workspace --no-fail-fast

# BlueChi's Python bindings (PyPI `bluechi`, pure Python on Debian's python3-dasbus),
# used by tests/tests/python_bindings.rs to prove API compatibility.
BLUECHI_PY_VERSION ?= 1.2.1
pydeps: target/pylib/bluechi/api.py
target/pylib/bluechi/api.py:
	python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target target/pylib bluechi==$(BLUECHI_PY_VERSION)

check: fmt clippy pure deny

fmt:
	$(CARGO) fmt --all -- --check

# The lints are in Cargo.toml's [workspace.lints]. The second pass holds the
# shipped code (libraries and binaries, not tests, examples or testkit) to no
# `.unwrap()`, which tests use freely.
clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --exclude drover-testkit --lib --bins -- -D warnings -D clippy::unwrap_used

# The shared contracts build without their I/O parts: drover-protocol without
# tokio (feature `io` off), drover-bus without zbus (feature `zbus` off), as
# the proxy helper and other light users take them.
pure:
	$(CARGO) build -p drover-protocol --no-default-features
	$(CARGO) build -p drover-bus --no-default-features
	@! $(CARGO) tree -p drover-protocol -p drover-bus --no-default-features -e normal --prefix none | grep -E '^(tokio|zbus) '

# cargo-deny with deny.toml (the policy and why is written there). Licenses,
# duplicate versions and sources need only Cargo.lock: they always run. .ci/run
# installs cargo-deny when it is missing.
CARGO_DENY_VERSION ?= 0.20.2
deny:
	@$(CARGO) deny --version >/dev/null 2>&1 || { echo "make deny: cargo-deny is not installed: cargo install --locked cargo-deny@$(CARGO_DENY_VERSION)"; exit 1; }
	$(CARGO) deny --locked check bans licenses sources
	@$(MAKE) --no-print-directory deny-advisories

# Advisories need the RustSec database, cloned from GitHub. Fetched: checked,
# and a finding fails. Not fetched but an earlier copy is there: that copy is
# checked. Neither: one line says the check was skipped and why, and it passes.
ADVISORY_DBS ?= $(or $(CARGO_HOME),$(HOME)/.cargo)/advisory-dbs
deny-advisories:
	@if why=$$($(CARGO) deny --locked fetch db 2>&1); then \
		$(CARGO) deny --locked check advisories; \
	elif ls -d $(ADVISORY_DBS)/advisory-db-*/crates >/dev/null 2>&1; then \
		echo "deny: advisory database not updated, checking the copy fetched before"; \
		$(CARGO) deny --locked --offline check advisories; \
	else \
		reason=$$(printf '%s\n' "$$why" | grep -m1 '^fatal:' || printf '%s\n' "$$why" | grep . | tail -n1); \
		echo "deny: advisories check SKIPPED: the RustSec advisory database cannot be fetched ($${reason:-no reason given}) and no earlier copy exists"; \
	fi

bench:
	$(CARGO) run --release -p drover-bench -- all

# Installs into DESTDIR (default /) what a node or the manager host needs.
DESTDIR ?=
PREFIX ?= /usr
install:
	$(CARGO) build --release --workspace --bins
	install -Dm755 target/release/drover-manager $(DESTDIR)$(PREFIX)/libexec/drover-manager
	install -Dm755 target/release/drover-agent $(DESTDIR)$(PREFIX)/libexec/drover-agent
	install -Dm755 target/release/droverctl $(DESTDIR)$(PREFIX)/bin/droverctl
	install -Dm755 target/release/drover-proxy $(DESTDIR)$(PREFIX)/libexec/drover-proxy
	install -Dm755 target/release/drover-pki $(DESTDIR)$(PREFIX)/bin/drover-pki
	install -Dm644 units/drover-manager.service $(DESTDIR)$(PREFIX)/lib/systemd/system/drover-manager.service
	install -Dm644 units/drover-agent.service $(DESTDIR)$(PREFIX)/lib/systemd/system/drover-agent.service
	install -Dm644 units/drover-agent-user.service $(DESTDIR)$(PREFIX)/lib/systemd/user/drover-agent.service
	install -Dm644 units/drover-proxy@.service $(DESTDIR)$(PREFIX)/lib/systemd/system/drover-proxy@.service
	install -Dm644 units/drover-dep@.service $(DESTDIR)$(PREFIX)/lib/systemd/system/drover-dep@.service
	install -Dm644 units/drover-proxy-user@.service $(DESTDIR)$(PREFIX)/lib/systemd/user/drover-proxy@.service
	install -Dm644 units/drover-dep@.service $(DESTDIR)$(PREFIX)/lib/systemd/user/drover-dep@.service
	install -Dm644 units/org.eclipse.bluechi.conf $(DESTDIR)$(PREFIX)/share/dbus-1/system.d/org.eclipse.bluechi.conf
	install -Dm644 units/org.eclipse.bluechi.Agent.conf $(DESTDIR)$(PREFIX)/share/dbus-1/system.d/org.eclipse.bluechi.Agent.conf
	install -Dm644 units/manager.conf $(DESTDIR)$(PREFIX)/share/drover/manager.conf
	install -Dm644 units/agent.conf $(DESTDIR)$(PREFIX)/share/drover/agent.conf
