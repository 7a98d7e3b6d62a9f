// Command choria is a test-only build of the Choria broker, server and CLI for the provisioner's
// interoperability tests. It registers the plugins a provisioning server needs (the Go agent
// provider and the choria_provision agent) and lets each process name its provisioning JWT file
// through the CHORIA_PROVISION_JWT environment variable, so several servers with different JWTs
// can run from one binary. Without that variable the path given at link time (if any) is kept.
package main

import (
	"fmt"
	"os"

	"github.com/choria-io/go-choria/build"
	"github.com/choria-io/go-choria/cmd"
	"github.com/choria-io/go-choria/plugin"
	golangmco "github.com/choria-io/go-choria/providers/agent/mcorpc/golang"
	"github.com/choria-io/go-choria/providers/agent/mcorpc/golang/provision"
)

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "choria: %s: %v\n", what, err)
	os.Exit(1)
}

func main() {
	if jwt := os.Getenv("CHORIA_PROVISION_JWT"); jwt != "" {
		build.ProvisionJWTFile = jwt
	}

	if err := plugin.Register("golangmco", golangmco.ChoriaPlugin()); err != nil {
		fail("registering the Go agent provider", err)
	}
	if err := plugin.Register("choria_provision", provision.ChoriaPlugin()); err != nil {
		fail("registering the choria_provision agent", err)
	}

	if err := cmd.ParseCLI(); err != nil {
		fail("parsing the command line", err)
	}
	if err := cmd.Run(); err != nil {
		fail("running", err)
	}
}
