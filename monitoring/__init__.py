"""Monitoring: the Grafana dashboard of the RAG service, generated from code, and Prometheus
that scrapes Ray's metrics export."""
