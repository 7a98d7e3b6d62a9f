#!/bin/sh
# Sample provisioning helper in shell: plain (jwt) enrollment, with jq.
#
# Everything in the input comes from the server, that is from anyone holding a provisioning JWT.
# So nothing from it passes through the shell: one jq program reads the input as sent, checks the
# identity against the provisioner's grammar, compares the one fact it uses (the role) with a
# fixed value and writes the reply. Reading a field with `$(jq -r ...)` first would already
# change it (command substitution drops trailing newlines) and put it in reach of word splitting.
#
#   CHORIA_BROKERS   comma separated broker URLs for the provisioned servers (required)
set -eu

exec jq -c --arg brokers "${CHORIA_BROKERS:-}" '
  # The provisioner grammar: labels of ASCII letters, digits, "-" and "_", 1 to 63 bytes each,
  # separated by single dots, at most 253 bytes. \A and \z, not ^ and $: jq lets $ match before
  # a trailing newline.
  def identity_problem:
    if type != "string" then "the identity is not a string"
    elif length > 253 then "the identity is longer than 253 bytes"
    elif test("\\A[A-Za-z0-9_-]{1,63}(\\.[A-Za-z0-9_-]{1,63})*\\z") | not then
      "the identity is not a DNS-like name (labels of letters, digits, '\''-'\'' and '\''_'\'', 1 to 63 bytes, separated by single dots)"
    elif ascii_downcase | test("\\.(mcollective|choria)\\z") then
      "the identity is a Choria client name (*.mcollective, *.choria)"
    else null end;

  # The facts of the inventory (a JSON text), or {} when it is not the shape expected.
  def facts:
    (try fromjson catch null) as $inv
    | if ($inv | type) == "object" and ($inv.facts | type) == "object" then $inv.facts else {} end;

  if type != "object" then {defer: true, msg: "the input is not a JSON object"}
  elif (.identity | identity_problem) != null then
    {defer: true, msg: ("refused: " + (.identity | identity_problem))}
  elif $brokers == "" then {defer: true, msg: "CHORIA_BROKERS is not set"}
  else
    {
      configuration: ({
        "identity": .identity,
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": $brokers,
        "plugin.choria.use_srv": "false",
        "loglevel": "info"
      } + (if (.inventory | facts | .role) == "web"
           then {"classesfile": "/etc/choria/classes.txt"} else {} end)),
      msg: "configured by helper-plain.sh"
    }
  end
'
