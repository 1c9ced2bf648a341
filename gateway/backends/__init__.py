"""What serves a model: a local llama.cpp worker, another machine's server, or a set of replicas."""
