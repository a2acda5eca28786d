"""Submitting and following jobs from this machine through a cluster's login node over SSH (the client side).

``ssh`` holds the one authenticated connection; ``client`` submits, runs the jobs commands on the login node
and keeps what was last seen; the login node's side is ``python -m hpcdl.agent``.
"""
