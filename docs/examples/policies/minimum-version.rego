# Refuse servers older than a minimum Choria version; they should be upgraded first.
package choria.provisioner

minimum := "0.29.0"

version := input.inventory.version

too_old if semver.compare(version, minimum) < 0

default decision := {"allow": false, "reason": "the inventory names no version"}

decision := {"allow": false, "reason": sprintf("version %s is below the minimum %s", [version, minimum])} if too_old

decision := {"allow": true} if {
	semver.is_valid(version)
	not too_old
}
