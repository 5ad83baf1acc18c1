"""What runs inside a job: the preemption handler (save within the grace window, then
exit) and watch (publish each complete save of a trainer that cannot publish itself)."""
