"""The commands of ``docs/deploying.md``'s step-by-step for a new pool, for the tests
that run each one that can run without a cluster.

A command is a line of an ``sh`` code block between the section's heading and the
next section of the same level, comments and blank lines left out; each test names the
commands it runs, and ``test_deploying_doc`` fails on a command no test knows.
"""

import os
import re

from yurtcoord.testing.paths import REPO

DEPLOYING = os.path.join(REPO, "docs", "deploying.md")
STEP_BY_STEP = "## A new pool, step by step"

# Step 7's checks, run by test_poolpki against a pool of agents on loopback (the agent's
# address and the coordinator's server in place of the node's and the port forward's).
AGENT_ADDRESS = "127.0.0.1:10267"
ADMIN_KUBECONFIG = "deploy/pools/west/pki/admin.kubeconfig"
POOL_CHECKS = (
    f"yurtcoordctl --server {AGENT_ADDRESS} status",
    f"yurtcoordctl --server {AGENT_ADDRESS} members",
    f"kubectl --kubeconfig {ADMIN_KUBECONFIG} -n kube-system get lease yurthub "
    "-o jsonpath='{.spec.holderIdentity}'",
    f"kubectl --kubeconfig {ADMIN_KUBECONFIG} -n kube-node-lease get leases",
)


def step_by_step_commands(path: str = DEPLOYING) -> list[str]:
    """Every command of the step-by-step section, in order."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index(STEP_BY_STEP)
    end = text.find("\n## ", start + len(STEP_BY_STEP))
    section = text[start:end if end >= 0 else len(text)]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        commands += [line.strip() for line in block.splitlines()
                     if line.strip() and not line.strip().startswith("#")]
    return commands
