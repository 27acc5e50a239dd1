"""Running `ask --input` and `eval` over many machines: the samples sharded over Ray actors (`--ray`).

`options` holds the flags (no Ray import: every command may read them); `pool` the actor pool that hands
out work and takes back what a lost actor held; `worker` the actor (one backend each); `runs` the pool's
opening and the `ask --input` driver; `executor` the sweep's `RayExecutor` (`memagent.eval.executor.Executor`).
The driver alone writes the results file. Ray is the optional extra `memagent[ray]`, imported only when
`--ray` is given.
"""
