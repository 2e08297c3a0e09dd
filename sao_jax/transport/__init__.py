"""Moving trajectories, tasks and parameters between samplers and the learner.

Messages are versioned binary records (`records`), never pickles, so the same bytes can go
through a multiprocessing queue today and a Kafka topic later, and a corrupt or hostile message
can at worst be rejected, not executed. Parameters travel as versioned files (`params`).
"""
