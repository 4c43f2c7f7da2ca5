"""A job's stored form: the JSON the store holds under ``<namespace>/job/<job id>``.

Invariants:

* ``job_from_json`` reads back the job ``job_json`` wrote (spec, history, preemptions included);
* a record written by an older head reads back: every field added since the first version has a default
  here (``attempt``, ``resume_from``, ``preemptions``, ``message``, ``owner`` ...);
* the codec adds nothing of the manager's (the manager's sequence number ``seq`` rides beside it).
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.job import Job, JobSpec, JobState, Preempted
from orchestrator.core.statemachine import Transition


def job_json(job: Job) -> dict[str, Any]:
    d = job.to_dict()
    d["spec"] = job.spec.model_dump(mode="json")
    d["preemptions"] = [{"by": p.by, "reason": p.reason, "at": p.at, "checkpoint_path": p.checkpoint_path,
                         "checkpoint_s": p.checkpoint_s} for p in job.preemptions]
    return d


def job_from_json(d: dict[str, Any]) -> Job:
    return Job(
        job_id=d["job_id"], spec=JobSpec(**d["spec"]), priority=d["priority"], priority_class=d["priority_class"],
        submitted_at=d["submitted_at"], state=JobState(d["state"]),
        history=tuple(Transition(h["at"], JobState(h["state"]), h["reason"]) for h in d["history"]),
        lease_id=d.get("lease_id"), ray_submission_id=d.get("ray_submission_id"), attempt=d.get("attempt", 0),
        resume_from=d.get("resume_from"), placement_reason=d.get("placement_reason", ""),
        preemptions=tuple(Preempted(p["by"], p["reason"], p["at"], p.get("checkpoint_path"), p.get("checkpoint_s"))
                          for p in d.get("preemptions", [])),
        message=d.get("message", ""), owner=d.get("owner"),
    )
