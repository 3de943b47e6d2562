"""The Ray wiring: one Serve deployment per module, each a thin shim over a plain stage class
(retrieval/, generation/) or the HTTP app (app/), and `builder`, the composition root that
the serve config names. Deployment classes never decorate themselves or read the
environment; the builder applies their options. Nothing else imports this package."""
