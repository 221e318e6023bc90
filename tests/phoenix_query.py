"""Ask a running Phoenix, through its own client, what one project holds; print it as JSON.

Run by the Phoenix virtualenv's interpreter (tests/phoenix_server.py), not tracemem's:

    python tests/phoenix_query.py http://127.0.0.1:6006 support-agent

Prints {"spans": [{id (Phoenix's own), name, span_kind, trace_id, span_id, parent_id, attributes}], "sessions": [{session_id,
traces: [trace ids]}]}.
"""
from __future__ import annotations

import json
import sys

from phoenix.client import Client


def main(url: str, project: str) -> None:
    client = Client(base_url=url)
    spans = client.spans.get_spans(project_identifier=project, limit=10_000)
    sessions = client.sessions.list(project_name=project)
    print(json.dumps({
        "spans": [{"id": s.get("id"), "name": s["name"], "span_kind": s["span_kind"], "trace_id": s["context"]["trace_id"],
                   "span_id": s["context"]["span_id"], "parent_id": s.get("parent_id"),
                   "attributes": s.get("attributes") or {}} for s in spans],
        "sessions": [{"session_id": s["session_id"], "traces": [t["trace_id"] for t in s.get("traces") or ()]}
                     for s in sessions],
    }, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
