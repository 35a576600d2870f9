"""A workflow's whole life through a Python client generated from reins's OpenAPI description.

tests/it/api_fuzz.rs generates the client (openapi-python-client, package `reins_client`) and
runs this program with it on PYTHONPATH. Through the generated code only, it launches a
workflow that waits for a person at a human checkpoint, waits for it to wait, approves the
captured artifact, and waits for the workflow to complete with the expected result.

Environment: REINS_URL (the node's base URL), REINS_TOKEN (an API token), REINS_EMAIL (the
token owner's email, who the result says decided).
"""

import os
import pathlib
import time

from reins_client import AuthenticatedClient
from reins_client.api.rest import (
    get_api_v1_workflows_id,
    post_api_v1_workflows,
    post_api_v1_workflows_id_decide,
)
from reins_client.models import Decision, DecideBody, LaunchBody, LaunchReply, WorkflowRecord

# examples/review.js: an agent writes a file, the file is captured as an artifact, a person
# approves it, and a second agent reads the approved text.
SCRIPT = (pathlib.Path(__file__).resolve().parents[2] / "examples" / "review.js").read_text()

# Only detects a workflow that never gets there: each wait is a long poll on the server.
DEADLINE_SECONDS = 120


def record_once_it_leaves(client: AuthenticatedClient, run_id: str, statuses: set[str]) -> WorkflowRecord:
    """The record once its status is none of `statuses`, long-polling with `?wait=`."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        answer = get_api_v1_workflows_id.sync_detailed(run_id, client=client, wait="10s")
        record = answer.parsed
        assert answer.status_code == 200 and isinstance(record, WorkflowRecord), (
            f"GET {run_id}?wait=10s answered {answer.status_code}: {answer.content!r}"
        )
        if record.status not in statuses:
            return record
        assert time.monotonic() < deadline, f"{run_id} stayed {record.status}: {answer.content!r}"


def main() -> None:
    client = AuthenticatedClient(
        base_url=os.environ["REINS_URL"],
        token=os.environ["REINS_TOKEN"],
        raise_on_unexpected_status=True,
        timeout=60.0,
    )
    email = os.environ["REINS_EMAIL"]
    with client:
        launched = post_api_v1_workflows.sync_detailed(
            client=client, body=LaunchBody(script=SCRIPT, title="client round trip")
        )
        reply = launched.parsed
        assert launched.status_code == 201 and isinstance(reply, LaunchReply), (
            f"launch answered {launched.status_code}: {launched.content!r}"
        )
        assert reply.created, reply
        run_id = reply.run_id

        waiting = record_once_it_leaves(client, run_id, {"running"})
        assert waiting.status == "waiting_approval", f"{run_id} is {waiting.status}, not waiting_approval"
        checkpoint = next(c for c in waiting.checkpoints if c.status == "waiting")
        assert checkpoint.kind == "humanCheckpoint" and checkpoint.step_id == "review", checkpoint
        assert isinstance(checkpoint.artifact_version, int), checkpoint
        assert [w.kind for w in waiting.waiting_for] == ["person"], waiting.waiting_for

        decided = post_api_v1_workflows_id_decide.sync_detailed(
            run_id,
            client=client,
            body=DecideBody(
                step_id=checkpoint.step_id,
                attempt=checkpoint.attempt,
                artifact_version=checkpoint.artifact_version,
                decision=Decision.APPROVE,
                comment="looks right",
            ),
        )
        assert decided.status_code == 200, f"decide answered {decided.status_code}: {decided.content!r}"

        done = record_once_it_leaves(client, run_id, {"running", "waiting_approval"})
        assert done.status == "completed", f"{run_id} ended {done.status}: {done.error}"
        expected = {"decision": "approve", "by": email, "summary": {"echo": "the evidence\n"}}
        assert done.result == expected, f"{done.result!r} != {expected!r}"
        approved = next(c for c in done.checkpoints if c.step_id == "review")
        assert approved.status == "approved" and approved.decided_by == email, approved
        assert approved.comment == "looks right", approved
    print(f"{run_id} completed through the generated client: {done.result}")


if __name__ == "__main__":
    main()
