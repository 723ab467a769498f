"""Questions about problems and placements: lower bounds (`bounds.lower_bound`), replicas moved
between placements (`migration`), placing around failed GPUs (`failures`). Analysis builds on
`solvers.primitives` and imports no policy."""
