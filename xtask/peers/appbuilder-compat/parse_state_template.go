package builder

// ParseStateTemplate is the template entry point go-choria v0.30.2 calls. appbuilder v0.19.0
// replaced it with AppBuilder.RenderTemplate; this file is added to a build-time copy of
// appbuilder v0.19.0 (the newest version the module proxy serves) so go-choria compiles. The
// provisioning tests never render app builder templates, so a builder holding only the
// configuration is enough.
func ParseStateTemplate(body string, args map[string]any, flags map[string]any, cfg any) (string, error) {
	conf, _ := cfg.(map[string]any)
	b := &AppBuilder{cfg: conf}
	return b.RenderTemplate(body, args, flags)
}
