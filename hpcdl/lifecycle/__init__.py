"""A job's life seen from the login node: submission, states (the store's word and the backend's), following, the
Job handle, listings and sweep reports. Above the backends, below the command lines."""
