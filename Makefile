# Two entry points for a newcomer: `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test venv

$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]' --config-settings editable_mode=compat
	touch $@

venv: $(VENV)/.installed

# Runs one agent against the example configuration.
run: venv
	$(VENV)/bin/twistd -n yurtcoord --config etc/yurtcoord.ini

# Installs everything the tests need (venv, pip packages, etcd) and runs the suite.
test:
	bash .ci/run
