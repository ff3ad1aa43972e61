# One task runner for people and CI (.ci/run calls `make check` and `make test`).
CARGO ?= cargo
# Checks the host packages each goal needs and installs what is missing (apt-get, dnf).
HOST_DEPS ?= scripts/host-deps
# Every test binary runs even when an earlier one fails, so one red file hides nothing.
CARGO_TEST_FLAGS ?= --no-fail-fast

# The five shipped binaries (drover-pki is a binary of drover-tls). droverctl is
# built on its own: built with the others, cargo would give it their tokio
# features (the multi-thread scheduler, which pulls in libm), and every run
# would pay for loading it (docs/dev/notes/droverctl-startup.md, run E).
SHIPPED = -p drover-manager -p drover-agent -p drover-proxy -p drover-tls
SHIPPED_CTL = -p droverctl
# drover-dns is built on its own too, so hickory-server's dependencies never
# change the daemons' feature set.
SHIPPED_DNS = -p drover-dns
# Stripped, LTO build of what is installed (see [profile.dist] in Cargo.toml).
DIST_PROFILE = dist
DIST_BIN = target/$(DIST_PROFILE)
# Packed relative relocations (DT_RELR) in the installed binaries: 396 KiB less
# over the five (docs/packaging.md "Size"), fewer bytes for the loader to read.
# Only where the C library loads them (glibc 2.36, Debian 12, and newer); the
# packages then require libc6 (>= 2.36). `make deb DIST_RUSTFLAGS=` builds
# without them, for an older glibc.
comma := ,
DIST_RELR = $(shell v=$$(getconf GNU_LIBC_VERSION 2>/dev/null | sed -n 's/^glibc 2\.\([0-9]*\).*/\1/p'); \
	[ "$${v:-0}" -ge 36 ] && echo yes)
DIST_RUSTFLAGS ?= $(if $(DIST_RELR),-C link-arg=-Wl$(comma)-z$(comma)pack-relative-relocs)
# Added to the caller's RUSTFLAGS, and only when there is something to add (an
# empty RUSTFLAGS would hide the rustflags of a cargo config).
DIST_ENV = DROVER_DATADIR=$(PREFIX)/share $(if $(strip $(DIST_RUSTFLAGS)),RUSTFLAGS="$(strip $(RUSTFLAGS) $(DIST_RUSTFLAGS))")

DESTDIR ?=
PREFIX ?= /usr
DBUS_POLICY_DIR ?= /usr/share/dbus-1/system.d

.PHONY: all build build-all demo test test-machines check fmt clippy doc pure units deny deny-advisories bench pydeps \
	dist-build install install-bluechi-compat install-dns man completions deb deb-check fresh-check

all: build

build:
	$(CARGO) build --workspace --bins

# Everything `make test` compiles: binaries and tests, debug profile. Building
# only the binaries would not do: cargo enables dev-dependency features (tokio's
# test-util, ...) in test builds, so `cargo test` would compile them all again.
build-all:
	$(CARGO) build --workspace --all-targets

# README command 1: host packages, the build `make test` reuses, then a local
# cluster of real systemd nodes, a guided tour, torn down at the end.
demo:
	$(HOST_DEPS) demo
	$(MAKE) build-all
	target/debug/drover-sandbox demo

# README command 2: unit tests and integration tests on real systemd nodes.
# The integration tests start the daemons from target/debug (built by build-all).
test:
	$(HOST_DEPS) test
	$(MAKE) build-all
	$(MAKE) pydeps
	$(CARGO) test --workspace $(CARGO_TEST_FLAGS)

# README command 3: the operator's suite on booted machines (machines/tests/operator.rs,
# docs/dev/machines.md). Three Debian 12 machines boot with systemd-nspawn from a base
# tree built once with debootstrap (cached in /var/cache/drover-machines), the release
# packages of `make deb` are installed with apt, and the README's path is followed and
# checked. Minutes; not part of `make test`.
test-machines:
	$(HOST_DEPS) machines
	$(MAKE) deb
	DROVER_DEB_DIR=$(CURDIR)/target/debian $(CARGO) test -p drover-machines --features suite --test operator

# BlueChi's Python bindings (PyPI `bluechi`, pure Python on the distribution's
# python3-dasbus), used by tests/tests/python_bindings.rs to prove API compatibility.
BLUECHI_PY_VERSION ?= 1.2.1
pydeps: target/pylib/bluechi/api.py
target/pylib/bluechi/api.py:
	/usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target target/pylib bluechi==$(BLUECHI_PY_VERSION)

check: fmt clippy doc pure units deny

fmt:
	$(CARGO) fmt --all -- --check

# The lints are in Cargo.toml's [workspace.lints]. The second pass holds the
# shipped code (libraries and binaries, not tests, examples or testkit) to no
# `.unwrap()`, which tests use freely.
clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --exclude drover-testkit --lib --bins -- -D warnings -D clippy::unwrap_used

# The API docs build without a broken or private link: they state the
# invariants, and a link that no longer resolves is a doc gone stale.
doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet

# The shared contracts build without their I/O parts: drover-protocol without
# tokio (feature `io` off), drover-bus without zbus (feature `zbus` off), as
# the proxy helper and other light users take them.
pure:
	$(CARGO) build -p drover-protocol --no-default-features
	$(CARGO) build -p drover-bus --no-default-features
	@! $(CARGO) tree -p drover-protocol -p drover-bus --no-default-features -e normal --prefix none | grep -E '^(tokio|zbus) '

# The shipped system units' sandbox, scored by systemd-analyze (exposure 0.0-10.0;
# --threshold is in tenths and fails the command above it): the daemons and the
# templates every cross-node dependency starts (drover's and BlueChi's names).
# The manager must stay at or below 2.5; the other bounds are each unit's
# measured score plus a little: docs/security.md lists what each remaining
# exposure is for.
MANAGER_EXPOSURE_MAX ?= 25
AGENT_EXPOSURE_MAX ?= 20
PROXY_EXPOSURE_MAX ?= 10
DEP_EXPOSURE_MAX ?= 5
DNS_EXPOSURE_MAX ?= 20
UNIT_BOUNDS = drover-manager:$(MANAGER_EXPOSURE_MAX) drover-agent:$(AGENT_EXPOSURE_MAX) \
	drover-proxy@:$(PROXY_EXPOSURE_MAX) bluechi-proxy@:$(PROXY_EXPOSURE_MAX) \
	drover-dep@:$(DEP_EXPOSURE_MAX) bluechi-dep@:$(DEP_EXPOSURE_MAX) drover-dns:$(DNS_EXPOSURE_MAX)
units:
	@command -v systemd-analyze >/dev/null || { echo "make units: systemd-analyze missing (package systemd; scripts/host-deps demo)"; exit 1; }
	@for spec in $(UNIT_BOUNDS); do \
		unit=dist/usr/lib/systemd/system/$${spec%%:*}.service; max=$${spec##*:}; \
		out=$$(systemd-analyze security --offline=yes --threshold=$$max $$unit 2>&1) || { \
			echo "$$out"; echo "$$unit: exposure above the allowed $$max (tenths)"; exit 1; }; \
		echo "$$out" | tail -n 1; \
	done

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
	$(HOST_DEPS) bench
	$(CARGO) run --release -p drover-bench -- all

# The shipped binaries, stripped, knowing where their vendor files are.
dist-build:
	$(DIST_ENV) $(CARGO) build --profile $(DIST_PROFILE) $(SHIPPED) --bins
	$(DIST_ENV) $(CARGO) build --profile $(DIST_PROFILE) $(SHIPPED_CTL) --bins
	$(DIST_ENV) $(CARGO) build --profile $(DIST_PROFILE) $(SHIPPED_DNS) --bins

man:
	$(CARGO) run -q -p xtask -- man target/man

completions:
	$(CARGO) run -q -p xtask -- completions target/completions

# Installs into DESTDIR (default /) what a node or the manager host needs:
# binaries, units (their ExecStart= follow PREFIX), presets, D-Bus policy,
# vendor configs, /etc/drover examples (an existing file is kept), man pages,
# completions. dbus-daemon reads policies only from /usr/share/dbus-1/system.d
# and /etc/dbus-1/system.d, hence DBUS_POLICY_DIR does not follow PREFIX.
install: dist-build
	$(CARGO) run -q -p xtask -- install --bin-dir $(DIST_BIN) --destdir "$(DESTDIR)" \
		--prefix $(PREFIX) --dbus-policy-dir $(DBUS_POLICY_DIR)

# The optional BlueChi compatibility set (package drover-bluechi-compat): BlueChi's
# bluechi-proxy@.service and bluechi-dep@.service templates, system and user, so unit
# files written for BlueChi work unchanged. They run the drover-proxy of `make install`.
install-bluechi-compat:
	$(CARGO) run -q -p xtask -- install --package drover-bluechi-compat --bin-dir $(DIST_BIN) \
		--destdir "$(DESTDIR)" --prefix $(PREFIX) --dbus-policy-dir $(DBUS_POLICY_DIR)

# The optional DNS server (package drover-dns): drover-dns, its unit (not enabled),
# dns.conf, drover-dns(8).
install-dns:
	$(CARGO) run -q -p xtask -- install --package drover-dns --bin-dir $(DIST_BIN) \
		--destdir "$(DESTDIR)" --prefix $(PREFIX) --dbus-policy-dir $(DBUS_POLICY_DIR)

# Debian packages into target/debian/: drover-manager, drover-agent, droverctl, drover-common,
# drover-bluechi-compat, drover-dns.
deb:
	$(HOST_DEPS) deb
	$(MAKE) dist-build PREFIX=/usr
	rm -f target/debian/*.deb
	$(CARGO) run -q -p xtask -- deb --bin-dir $(DIST_BIN) --out target/debian

# The package test of `make test` (which packs the debug build), on the real packages.
# (The package test's install check uses the debug binaries, hence `build`.)
deb-check: deb build
	DROVER_DEB_DIR=$(CURDIR)/target/debian $(CARGO) test -p xtask --test packages

# README's two commands on a fresh Debian 12 root (debootstrap); see docs/dev/fresh-machine.md.
fresh-check:
	scripts/fresh-root-check
