"""Ini text of agents whose peers are plain-http servers on loopback.

Tests, the fault suite, the benchmarks and the sandbox all run such agents; they differ
only in names, URLs, directories and timings, which they pass as sections to merge.
"""

from collections.abc import Iterable, Mapping


def ini_text(sections: Mapping[str, Mapping[str, object]]) -> str:
    """Ini text of ``{section: {key: value}}``, in the order given."""
    blocks = []
    for section, values in sections.items():
        lines = [f"[{section}]"] + [f"{key} = {value}" for key, value in values.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def loopback_agent_ini(node: str, pool: str, cloud_urls: Iterable[str], coordinator_url: str,
                       etcd_url: str, pki_dir: str, cache_dir: str,
                       **sections: Mapping[str, object]) -> str:
    """An agent talking plain http to its cloud, coordinator apiserver and etcd.

    Its kubelet check is off (``kubelet_healthz_url = off``) unless ``heartbeat`` names
    a URL: an agent of a test that has no kubelet stand-in would otherwise stop its
    heartbeats after the grace period. ``sections`` (e.g. ``leader_election={"lease_duration": "2s"}``) are merged over
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
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return ini_text({name: values for name, values in base.items() if values})
