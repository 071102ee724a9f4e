"""A training loop as a test run sees it (TRACKWAY_MAX_STEPS, TRACKWAY_RESTORE_CHECK); argv[1] picks the behaviour.

canonical  the loop of the docs: log, save on should_stop, exit_preempted()
ignores    never reads should_stop: logs on past the max steps
writing    checkpoints through `writing()` (files trackway does not write itself)
drifting   a model whose state changes between save and read-back (a state_dict that is not the state)
"""

import sys

import trackway

mode = sys.argv[1]
run = trackway.init()
if mode in ("canonical", "drifting"):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if mode == "drifting":
        original = model.state_dict

        def drifting_state_dict(*args, **kwargs):
            state = original(*args, **kwargs)
            return {k: v + torch.rand_like(v) for k, v in state.items()}

        model.state_dict = drifting_state_dict
for step in range(1, 1000):
    loss = 1.0 / step
    if mode in ("canonical", "drifting"):
        out = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        out.backward()
        optimizer.step()
        loss = out.item()
    run.log({"loss": loss}, step=step)
    if mode == "ignores":
        continue
    if run.should_stop:
        if mode == "writing":
            with run.checkpoints.writing(step) as directory:
                (directory / "weights.bin").write_bytes(bytes(range(256)) * 64)
        else:
            run.checkpoints.save(step, model=model, optimizer=optimizer, data_state={"step": step})
        run.exit_preempted()
run.finish()
