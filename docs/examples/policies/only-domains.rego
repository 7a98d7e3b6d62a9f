# Only nodes whose identity ends in one of the site's domains may be provisioned.
package choria.provisioner

domains := {"example.net", "lab.example.net"}

in_domain if {
	some d in domains
	endswith(input.identity, concat("", [".", d]))
}

default decision := {"allow": false, "reason": "identity is not in an allowed domain"}

decision := {"allow": true, "reason": "identity is in an allowed domain"} if in_domain
