"""Durations as the agent's ini file spells them, for configuration and log lines.

``yurtcoord.agent.config`` reads them (``parse_duration``) and the parts below the
agent (the heartbeat delegation's log lines) write them, so the one writer lives here,
below both.
"""


def format_duration(seconds: float) -> str:
    """The shortest ini spelling of ``seconds`` that ``parse_duration`` reads back exactly."""
    milliseconds = round(seconds * 1000)
    if abs(milliseconds / 1000 - seconds) > 1e-9:
        return f"{seconds!r}s"
    if milliseconds == 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1)):
        count, milliseconds = divmod(milliseconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
