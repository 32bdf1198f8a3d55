"""Inference endpoints on the ingress: their part of HAProxy's configuration, the control plane that keeps their
routes, servers and tokens, and the activator that holds requests for an endpoint with no routable replica."""
