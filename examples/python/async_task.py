"""A long-running async function, submitted as a task and fetched later.

    python examples/python/async_task.py

`@app.function(task=True)` documents `train` as long-running. The client submits it
(`ferry.task.submit`), gets a task id at once, polls `task_status` while it runs and
fetches its result with `task_result`. The task belongs to this connection: closing it
cancels the task.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ferry

app = ferry.App("async-task")


@dataclass
class TrainResult:
    steps: int
    loss: float


@app.function(task=True)
async def train(steps: int, step_seconds: float = 0.05) -> TrainResult:
    """Pretends to train for `steps` steps; returns the final loss."""
    loss = 1.0
    for _ in range(steps):
        await asyncio.sleep(step_seconds)  # real work would go here
        loss *= 0.5
    return TrainResult(steps=steps, loss=loss)


if __name__ == "__main__":
    with ferry.spawn(app) as client:
        task = client.submit("train", {"steps": 6, "step_seconds": 0.05})
        print("submitted task", task)
        deadline = time.monotonic() + 30  # bounded: give up after 30 s
        status = client.task_status(task)
        while status["state"] == "running" and time.monotonic() < deadline:
            print(f"state={status['state']} elapsed_ms={status['elapsed_ms']}")
            time.sleep(0.1)
            status = client.task_status(task)
        print("final state:", status["state"])
        print("result:", client.task_result(task, wait_ms=1000))
