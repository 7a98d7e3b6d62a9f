# Provision only between 02:00 and 05:59 UTC; outside the window nodes are deferred and taken
# again by a later discovery.
package choria.provisioner

hour := time.clock([input.now_ns, "UTC"])[0]

in_window if {
	hour >= 2
	hour < 6
}

default decision := {"allow": false, "defer": true, "reason": "outside the maintenance window 02:00-06:00 UTC"}

decision := {"allow": true} if in_window
