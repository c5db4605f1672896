# Two entry points for a newcomer: `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test venv

# `make run` installs what running needs (the agent and the sandbox's etcd); `make
# test` (.ci/run) installs the test tools on top.
$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[sandbox]' --config-settings editable_mode=compat
	touch $@

venv: $(VENV)/.installed

# Runs the sandbox: a real 3-member etcd cluster, a simulated cloud apiserver, 2
# coordinator apiservers over that etcd and a pool of 3 agents on loopback (AGENTS=N
# for another size, ETCD_MEMBERS=1 for one etcd on a small machine). The terminal shows
# role changes and each agent's pool page URL; the agents' full log goes to
# SANDBOX_LOG. Ctrl-C stops everything and removes the sandbox's temp dir.
AGENTS ?= 3
ETCD_MEMBERS ?= 3
SANDBOX_LOG ?= /tmp/yurtcoord-sandbox.log
run: venv
	@echo "yurtcoord sandbox: full log in $(SANDBOX_LOG)"
	$(VENV)/bin/twistd --nodaemon --pidfile= --logfile=$(SANDBOX_LOG) yurtcoord --sandbox --sandbox-agents $(AGENTS) --sandbox-etcd-members $(ETCD_MEMBERS)

# Installs everything the tests need (venv, pip packages, etcd) and runs the suite.
test:
	bash .ci/run
