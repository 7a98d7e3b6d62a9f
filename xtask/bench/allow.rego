# The small allow-policy of `cargo xtask bench --rego-policy`: every node with an identity and
# an inventory is admitted, after looking at both.
package choria.provisioner

default decision := {"allow": false, "reason": "no identity or inventory"}

decision := {"allow": true} if {
	input.identity != ""
	is_object(input.inventory)
}
