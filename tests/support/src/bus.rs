//! A private `dbus-daemon` for one test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Bus {
    child: Child,
    /// Holds the socket and configuration; removed when the bus is dropped.
    _dir: tempfile::TempDir,
    pub address: String,
}

/// The bus configuration: anyone may connect, own names and call anything, so that the
/// agent's own access checks are what a test sees. `extra` is inserted verbatim (e.g. an
/// `<include>` of the packaged system policy).
fn config(socket: &Path, extra: &str, open: bool) -> String {
    let policy = if open {
        r#"<policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow receive_sender="*"/>
  </policy>"#
    } else {
        // As Debian's system.conf: deny by default, allow the bus itself.
        r#"<policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>"#
    };
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <limit name="max_connections_per_user">4096</limit>
  <limit name="max_incomplete_connections">4096</limit>
  <limit name="max_completed_connections">4096</limit>
  {policy}
  {extra}
</busconfig>
"#,
        socket.display()
    )
}

impl Bus {
    /// A bus where everything is allowed.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(true, "")
    }

    /// A bus with the system bus's deny-by-default policy plus `extra` configuration.
    #[must_use]
    pub fn start_system_like(extra: &str) -> Self {
        Self::start_with(false, extra)
    }

    fn start_with(open: bool, extra: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpuslice-bus-")
            .tempdir()
            .expect("tempdir");
        // Let unprivileged test clients reach the socket.
        let _ = std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
        let socket = dir.path().join("socket");
        let conf = dir.path().join("bus.conf");
        std::fs::write(&conf, config(&socket, extra, open)).expect("bus config");
        let child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--nopidfile"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon (apt-get install dbus)");
        // The socket file appears at bind(), before listen(): a client in between is refused.
        // Ready is when a connection is accepted.
        assert!(
            crate::wait_for(Duration::from_secs(10), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            }),
            "dbus-daemon did not start"
        );
        Self {
            child,
            address: format!("unix:path={}", socket.display()),
            _dir: dir,
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
