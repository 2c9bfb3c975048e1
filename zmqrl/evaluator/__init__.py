"""The evaluator process and greedy scoring, which the learner and ``zmqrl eval`` share."""
