"""Machine-readable benchmark results: what ``--json PATH`` writes, what bench/run reads.

A result is one JSON object::

    {"benchmark": "upload", "settings": {...}, "figures": {...},
     "rows": [{"measure": "...", "result": "...", "target": "..." or null,
               "met": true / false / null}]}

``rows`` are the headline figures as they appear in bench/RESULTS.md (``met`` is null
where there is no target); ``figures`` holds the raw numbers behind them.
"""

import json
import os


def row(measure, result, target=None, met=None):
    """One headline figure; ``met`` only means something with a ``target``."""
    return {"measure": measure, "result": result, "target": target,
            "met": None if target is None else bool(met)}


def write_result(path, benchmark, settings, figures, rows):
    """Write the result to ``path`` (atomically: a crash never leaves half a file)."""
    if not path:
        return
    document = {"benchmark": benchmark, "settings": settings, "figures": figures,
                "rows": rows}
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(partial, path)
