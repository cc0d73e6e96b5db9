"""Plan search: enumeration, pruning with reasons, analytic ranking, heterogeneous balancing, findings."""
