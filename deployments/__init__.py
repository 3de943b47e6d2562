"""One Ray Serve deployment per module; each is a thin shim over plain code. The builder in
`app.builder` applies their options; they never decorate themselves or read the environment."""
