# Shell functions shared by the Debian package's postinst and the RPM's pre-install and
# post-install scriptlets: `cargo xtask dist` puts this file where their @MAINTAINER_FUNCTIONS@
# line is. POSIX sh, and no percent sign anywhere, since rpm would read one as the start of a
# macro.

cp_user=choria-provisioner
cp_etc=/etc/choria-provisioner
cp_bin=/usr/sbin/choria-provisioner
cp_unit=choria-provisioner.service

# The service account. systemd-sysusers makes it from the packaged sysusers.d line (passed as $1
# by the RPM's pre-install scriptlet, which runs before the file is unpacked); where
# systemd-sysusers is missing or too old to take --replace (EL7), groupadd and useradd make the
# same account.
cp_account() {
    if command -v systemd-sysusers >/dev/null 2>&1; then
        if [ -n "$1" ]; then
            echo "$1" | systemd-sysusers --replace=/usr/lib/sysusers.d/choria-provisioner.conf - >/dev/null 2>&1 || :
        else
            systemd-sysusers /usr/lib/sysusers.d/choria-provisioner.conf >/dev/null 2>&1 || :
        fi
    fi
    if ! getent group "$cp_user" >/dev/null; then
        groupadd --system "$cp_user"
    fi
    if ! getent passwd "$cp_user" >/dev/null; then
        nologin=/usr/sbin/nologin
        [ -x "$nologin" ] || nologin=/sbin/nologin
        useradd --system --gid "$cp_user" --home-dir /var/lib/choria-provisioner --no-create-home \
            --shell "$nologin" --comment "Choria Provisioner" "$cp_user"
    fi
}

# A directory the unit names in StateDirectory= or LogsDirectory=, made for the account when it
# is missing, so that `check` (which wants audit_file's directory) passes before the first start.
# An existing one is left as it is: systemd hands it, and what is in it, to the unit's user at the
# next start (which is root under the run-as-root drop-in).
cp_directory() {
    [ -d "$1" ] || install -d -m "$2" -o "$cp_user" -g "$cp_user" "$1"
}

# What the service needs to read and write. The configuration directory and files are root's and
# readable by the account's group: set on a first install ($1 = install); on upgrades only the
# group, and only where it is still root's or nobody's (what this package's earlier releases and
# the Go package left), so an operator's own choice of group and mode stays.
cp_permissions() {
    for f in "$cp_etc" "$cp_etc/choria-provisioner.yaml" "$cp_etc/choria.cfg"; do
        [ -e "$f" ] || continue
        case "$(ls -ld "$f" | awk '{ print $4 }')" in
            root | nobody | nogroup) chgrp "$cp_user" "$f" ;;
        esac
    done
    if [ "$1" = install ]; then
        chmod 0750 "$cp_etc"
        chmod 0640 "$cp_etc/choria-provisioner.yaml" "$cp_etc/choria.cfg"
    fi
    cp_directory /var/lib/choria-provisioner 0750
    cp_directory /var/log/choria-provisioner 0755
    # The Go package's log file, which the unit lets the service write: the tmpfiles.d entry
    # creates it (again at every boot) and gives it to the account; without systemd-tmpfiles
    # (containers) the same is done here.
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        systemd-tmpfiles --create /usr/lib/tmpfiles.d/choria-provisioner.conf >/dev/null 2>&1 || :
    fi
    [ -e /var/log/choria-provisioner.log ] || install -m 0660 /dev/null /var/log/choria-provisioner.log
    chown "$cp_user:$cp_user" /var/log/choria-provisioner.log
    chmod 0660 /var/log/choria-provisioner.log
}

# On upgrade: restart a running service only when the new version's `check` accepts its
# configuration, run as the unit runs the daemon: its User= and Group=, its Environment= and the
# files its ExecStart= names (drop-ins included), with no capability and no new privileges.
# Otherwise the running process is left alone and one message says why and what to run.
cp_restart_if_check_passes() {
    systemctl daemon-reload >/dev/null 2>&1 || :
    systemctl is-active --quiet "$cp_unit" >/dev/null 2>&1 || return 0
    user=$(systemctl show --property=User "$cp_unit" 2>/dev/null | sed -n 's/^User=//p')
    group=$(systemctl show --property=Group "$cp_unit" 2>/dev/null | sed -n 's/^Group=//p')
    [ -n "$user" ] || user=root
    [ -n "$group" ] || group=$(id -gn "$user" 2>/dev/null || echo root)
    config=$cp_etc/choria-provisioner.yaml
    choria=$cp_etc/choria.cfg
    set -f
    set -- $(systemctl show --property=ExecStart "$cp_unit" 2>/dev/null | sed -n 's/.*argv\[\]=\([^;]*\);.*/\1/p')
    while [ $# -gt 0 ]; do
        case "$1" in
            --config) config=$2; shift ;;
            --config=*) config=${1#--config=} ;;
            --choria-config) choria=$2; shift ;;
            --choria-config=*) choria=${1#--choria-config=} ;;
        esac
        shift
    done
    home=$(getent passwd "$user" | cut -d: -f6)
    uid=$(id -u "$user" 2>/dev/null || echo "$user")
    gid=$(getent group "$group" | cut -d: -f3)
    set -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        "HOME=${home:-/}" "USER=$user" "LOGNAME=$user"
    unit_env=
    for kv in $(systemctl show --property=Environment "$cp_unit" 2>/dev/null | sed -n 's/^Environment=//p'); do
        case "$kv" in
            [A-Za-z_]*=*) set -- "$@" "$kv"; unit_env="$unit_env $kv" ;;
        esac
    done
    set +f
    set -- "$@" "$cp_bin" check --config "$config" --choria-config "$choria"
    if command -v setpriv >/dev/null 2>&1; then
        set -- setpriv --reuid="$uid" --regid="${gid:-$group}" --init-groups --inh-caps=-all \
            --bounding-set=-all --no-new-privs "$@"
    elif [ "$user" != root ]; then
        set -- runuser -u "$user" -g "$group" -- "$@"
    fi
    if out=$(cd / && "$@" 2>&1); then
        systemctl try-restart "$cp_unit" >/dev/null 2>&1 || :
        return 0
    fi
    problems=$(echo "$out" | grep '^problem: ' || echo "$out" | tail -n 1)
    again="$cp_bin check --config $config --choria-config $choria"
    [ -z "$unit_env" ] || again="env$unit_env $again"
    [ "$user" = root ] || again="runuser -u $user -- $again"
    cat >&2 <<EOF
choria-provisioner: $cp_unit was NOT restarted and keeps running the previous
version: the new version's check refuses the configuration as the unit runs it (as $user):
$(echo "$problems" | sed 's/^/    /')
Fix what check reports (service.md and migrating.md in /usr/share/doc/choria-provisioner/docs),
then run:
    $again
    systemctl restart choria-provisioner
EOF
    return 0
}
