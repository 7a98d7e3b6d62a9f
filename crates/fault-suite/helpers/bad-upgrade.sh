# A valid reply that asks for an upgrade to a version no RPM parser accepts.
CHORIA_UPGRADE_TO='1.0:2:3~~:::' exec '@DEMO@' "$@"
