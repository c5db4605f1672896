"""Ini text of agents: the one place where agent configuration text is written.

``ini_text`` renders ``{section: {key: value}}`` and ``merge_sections`` lays such
sections over each other, key by key. ``loopback_agent_ini`` is an agent whose peers
are plain-http servers on loopback; tests, the fault suite, the benchmarks and the
sandbox all run such agents and differ only in names, URLs, directories and timings.
Their timings are the named presets below, passed as layers over the base.
"""

from collections.abc import Iterable, Mapping

from yurtcoord.agent.config import SCHEMA
from yurtcoord.names import ELECTION_LEASE_NAME, ELECTION_LEASE_NAMESPACE

Sections = Mapping[str, Mapping[str, object]]


def ini_text(sections: Sections) -> str:
    """Ini text of ``{section: {key: value}}``, in the order given."""
    blocks = []
    for section, values in sections.items():
        lines = [f"[{section}]"] + [f"{key} = {value}" for key, value in values.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def merge_sections(*layers: Sections) -> dict[str, dict[str, object]]:
    """The sections of every layer, a later layer's keys over an earlier one's; a key
    keeps the place where it first appeared, a section not seen before is added."""
    merged: dict[str, dict[str, object]] = {}
    for layer in layers:
        for section, values in layer.items():
            merged.setdefault(section, {}).update(values)
    return merged


def configuration_defaults(preset: Sections) -> dict[str, dict[str, object]]:
    """The configuration's own default of every key ``preset`` sets: an agent built
    from a test preset but run with the timings an operator's agent runs with (the
    benchmarks judge a leader of thousands of nodes that way, not with the fault
    suite's 2 s renew deadline)."""
    defaults = {(key.section, key.name): key.default for key in SCHEMA}
    return {section: {name: defaults[(section, name)] for name in values}
            for section, values in preset.items()}


# The election lease the test worlds read, written out (it is the agents' default).
TEST_ELECTION_LEASE: Sections = {
    "leader_election": {"lease_namespace": ELECTION_LEASE_NAMESPACE,
                        "lease_name": ELECTION_LEASE_NAME},
}

# The fault suite's short timings (agents as separate processes). A heartbeat probe
# tries failed_retry attempts of up to timeout within interval: 1 s attempts leave
# room for a slow cloud (answers 0.6 s late), and 3 of them with their pauses (0.25 s,
# 0.5 s) end within the 4 s interval. The kubelet grace period is long enough that a
# busy test reactor serving the stand-in kubelets does not make a live kubelet look
# dead, and longer than the heartbeat interval at which the kubelet is asked; tests of
# the kubelet gate pass a shorter one.
FAULT_SUITE: Sections = merge_sections(TEST_ELECTION_LEASE, {
    "leader_election": {"lease_duration": "3s", "renew_deadline": "2s",
                        "retry_period": "500ms", "check_interval": "500ms"},
    "heartbeat": {"interval": "4s", "failed_retry": "3", "healthy_threshold": "1",
                  "timeout": "1s", "kubelet_grace_period": "10s"},
    "pool_cache": {"informer_lease_renew": "1s", "stale_timeout": "4s"},
})

# The timings of agents built in the test process: lease 2 s, renew 1.5 s, retry and
# check every 0.3 s; a heartbeat every 4 s in up to 3 attempts of 1.2 s (a first write
# reads the lease and the Node, then creates), healthy after one probe.
IN_PROCESS_SUITE: Sections = merge_sections(TEST_ELECTION_LEASE, {
    "leader_election": {"lease_duration": "2s", "renew_deadline": "1500ms",
                        "retry_period": "300ms", "check_interval": "300ms"},
    "heartbeat": {"interval": "4s", "failed_retry": "3", "healthy_threshold": "1",
                  "timeout": "1200ms"},
    "pool_cache": {"informer_lease_renew": "1s", "stale_timeout": "3s"},
})

# The sandbox's timings: short enough to watch an election happen and a stopped
# kubelet's node go stale within seconds, long enough for a busy laptop.
SANDBOX: Sections = {
    "leader_election": {"lease_duration": "6s", "renew_deadline": "4s",
                        "retry_period": "1s", "check_interval": "1s"},
    "heartbeat": {"interval": "2s", "failed_retry": "3", "healthy_threshold": "1",
                  "timeout": "2s", "kubelet_grace_period": "6s"},
    "pool_cache": {"informer_lease_renew": "3s", "stale_timeout": "10s",
                   "upload_resources": "kubelet/pods/v1, kubelet/nodes/v1"},
}


def node_identity(kubelet_client_cert: str) -> Sections:
    """The layer of an agent that reaches its coordinator apiservers and the pool etcd
    over TLS: its node lease as its node, with the node's own certificate and key
    (the kubelet's) at ``kubelet_client_cert``, the rest with the certs Secret's
    certificates, which it fetches from the cloud."""
    return {"node": {"kubelet_client_cert": kubelet_client_cert},
            "coordinator": {"insecure": "false"}}


def loopback_agent_ini(node: str, pool: str, cloud_urls: Iterable[str], coordinator_url: str,
                       etcd_url: str, pki_dir: str, cache_dir: str, *presets: Sections,
                       **sections: Mapping[str, object]) -> str:
    """An agent talking plain http to its cloud, coordinator apiserver and etcd
    (https to the last two with a ``node_identity`` layer).

    Its kubelet check is off (``kubelet_healthz_url = off``) unless ``heartbeat`` names
    a URL: an agent of a test that has no kubelet stand-in would otherwise stop its
    heartbeats after the grace period. ``presets`` (e.g. ``FAULT_SUITE``), then
    ``sections`` (e.g. ``leader_election={"lease_duration": "2s"}``) are merged over
    the base, key by key; a section not in the base is added.
    """
    base: dict[str, dict[str, object]] = {
        "node": {"name": node, "pool": pool},
        "cloud": {"servers": ", ".join(cloud_urls), "insecure": "true"},
        "coordinator": {"enabled": "true", "server": coordinator_url, "storage": etcd_url,
                        "storage_prefix": "/registry", "pki_dir": pki_dir,
                        "insecure": "true"},
        "leader_election": {},
        "heartbeat": {"kubelet_healthz_url": "off"},
        "pool_cache": {"upload_resources": "kubelet/pods/v1", "local_cache_dir": cache_dir},
        "server": {"listen": "127.0.0.1:0"},
    }
    merged = merge_sections(base, *presets, sections)
    return ini_text({name: values for name, values in merged.items() if values})
