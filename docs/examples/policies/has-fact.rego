# Only nodes whose inventory says they were built by the site's build system.
package choria.provisioner

built_by_pxe if input.inventory.facts.provisioning.built_by == "pxe"

default decision := {"allow": false, "reason": "inventory has no facts.provisioning.built_by = pxe"}

decision := {"allow": true} if built_by_pxe
