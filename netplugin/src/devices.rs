//! Network devices: one per selected interface, chosen the way NCCL's Socket transport does.
//!
//! `NCCL_SOCKET_IFNAME` is a comma-separated list of name prefixes; a leading `^` excludes
//! them, a following `=` makes them exact names (`=eth0`, `^=docker0`). Unset, interfaces are
//! picked by NCCL's order: `ib*`, then anything but `docker*`/`lo`/`virbr*`, then `docker*`,
//! then `virbr*`. Unlike NCCL, loopback is used only when asked for (`NCCL_SOCKET_IFNAME=lo`).
//! `NCCL_SOCKET_FAMILY=AF_INET|AF_INET6` restricts the address family.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// At most this many devices, as NCCL's `MAX_IFS`.
pub const MAX_DEVICES: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
}

/// A device reported to NCCL.
#[derive(Debug)]
pub struct Device {
    pub name: CString,
    pub pci_path: Option<CString>,
    pub addr: IpAddr,
    pub speed_mbps: i32,
}

impl Device {
    pub fn bind_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, 0)
    }
}

/// A parsed `NCCL_SOCKET_IFNAME`.
struct IfFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfFilter {
    fn parse(spec: &str) -> IfFilter {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect();
        IfFilter {
            exclude,
            exact,
            names,
        }
    }

    fn matches(&self, ifname: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                ifname == n
            } else {
                ifname.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn parse(s: &str) -> Option<Family> {
        match s.trim() {
            "AF_INET" => Some(Family::V4),
            "AF_INET6" => Some(Family::V6),
            _ => None,
        }
    }
    fn admits(self, a: &IpAddr) -> bool {
        matches!(
            (self, a),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }
}

fn usable(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => !v.is_unspecified(),
        // NCCL skips IPv6 loopback; link-local addresses need a scope id we do not carry.
        IpAddr::V6(v) => {
            !v.is_loopback() && !v.is_unspecified() && (v.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// Chooses devices from `ifaces` (in `getifaddrs` order): one address per interface, at most
/// [`MAX_DEVICES`].
pub fn select(
    ifaces: &[Interface],
    ifname: Option<&str>,
    family: Option<Family>,
) -> Vec<Interface> {
    let mut first: Vec<Interface> = Vec::new();
    for i in ifaces {
        if usable(&i.addr)
            && family.is_none_or(|f| f.admits(&i.addr))
            && !first.iter().any(|f| f.name == i.name)
        {
            first.push(i.clone());
        }
    }
    let pick = |pred: &dyn Fn(&str) -> bool| -> Vec<Interface> {
        first
            .iter()
            .filter(|i| pred(&i.name))
            .take(MAX_DEVICES)
            .cloned()
            .collect()
    };
    if let Some(spec) = ifname.filter(|s| !s.trim().is_empty()) {
        let f = IfFilter::parse(spec);
        return pick(&|n| f.matches(n));
    }
    let steps: [&dyn Fn(&str) -> bool; 4] = [
        &|n| n.starts_with("ib"),
        &|n| !n.starts_with("docker") && n != "lo" && !n.starts_with("virbr"),
        &|n| n.starts_with("docker"),
        &|n| n.starts_with("virbr"),
    ];
    steps
        .iter()
        .map(|p| pick(*p))
        .find(|v| !v.is_empty())
        .unwrap_or_default()
}

/// Every up and running interface with an address, in `getifaddrs` order.
pub fn list_interfaces() -> std::io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags as libc::c_int;
        if ifa.ifa_addr.is_null() || flags & libc::IFF_UP == 0 || flags & libc::IFF_RUNNING == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family says its type.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push(Interface { name, addr });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn read_speed(ifname: &str) -> i32 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(10_000)
}

fn pci_path(ifname: &str) -> Option<CString> {
    let p = std::fs::canonicalize(format!("/sys/class/net/{ifname}/device")).ok()?;
    CString::new(p.to_string_lossy().into_owned()).ok()
}

/// Discovers devices from the environment.
pub fn discover(speed_override: u32) -> Result<Vec<Device>, String> {
    let ifname = std::env::var("NCCL_SOCKET_IFNAME").ok();
    let family_var = std::env::var("NCCL_SOCKET_FAMILY").ok();
    let family = match family_var.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            Family::parse(s)
                .ok_or_else(|| format!("NCCL_SOCKET_FAMILY={s:?} is not AF_INET or AF_INET6"))?,
        ),
    };
    let ifaces = list_interfaces().map_err(|e| format!("getifaddrs failed: {e}"))?;
    let chosen = select(&ifaces, ifname.as_deref(), family);
    if chosen.is_empty() {
        return Err(format!(
            "no usable network interface (NCCL_SOCKET_IFNAME={}, NCCL_SOCKET_FAMILY={}; loopback is used only when NCCL_SOCKET_IFNAME selects it)",
            ifname.as_deref().unwrap_or("<unset>"),
            family_var.as_deref().unwrap_or("<unset>")
        ));
    }
    Ok(chosen
        .into_iter()
        .map(|i| Device {
            speed_mbps: if speed_override > 0 {
                speed_override as i32
            } else {
                read_speed(&i.name)
            },
            pci_path: pci_path(&i.name),
            name: CString::new(i.name.clone()).unwrap_or_default(),
            addr: i.addr,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs(list: &[(&str, &str)]) -> Vec<Interface> {
        list.iter()
            .map(|(n, a)| Interface {
                name: n.to_string(),
                addr: a.parse().unwrap(),
            })
            .collect()
    }

    fn names(v: Vec<Interface>) -> Vec<String> {
        v.into_iter().map(|i| i.name).collect()
    }

    #[test]
    fn auto_selection_order() {
        let all = ifs(&[
            ("lo", "127.0.0.1"),
            ("docker0", "172.17.0.1"),
            ("eth0", "10.0.0.2"),
            ("eth1", "10.1.0.2"),
        ]);
        assert_eq!(names(select(&all, None, None)), ["eth0", "eth1"]);
        let with_ib = ifs(&[("eth0", "10.0.0.2"), ("ib0", "192.168.0.2")]);
        assert_eq!(names(select(&with_ib, None, None)), ["ib0"]);
        let docker_only = ifs(&[("lo", "127.0.0.1"), ("docker0", "172.17.0.1")]);
        assert_eq!(names(select(&docker_only, None, None)), ["docker0"]);
        let lo_only = ifs(&[("lo", "127.0.0.1")]);
        assert!(
            select(&lo_only, None, None).is_empty(),
            "loopback only when asked"
        );
        assert_eq!(names(select(&lo_only, Some("lo"), None)), ["lo"]);
    }

    #[test]
    fn ifname_prefix_exclude_exact() {
        let all = ifs(&[
            ("lo", "127.0.0.1"),
            ("eth0", "10.0.0.2"),
            ("eth10", "10.0.1.2"),
            ("ens5", "10.2.0.2"),
        ]);
        assert_eq!(names(select(&all, Some("eth"), None)), ["eth0", "eth10"]);
        assert_eq!(names(select(&all, Some("=eth0"), None)), ["eth0"]);
        assert_eq!(names(select(&all, Some("^eth,lo"), None)), ["ens5"]);
        assert_eq!(
            names(select(&all, Some("^=eth0"), None)),
            ["lo", "eth10", "ens5"]
        );
        assert_eq!(
            names(select(&all, Some("eth1,ens"), None)),
            ["eth10", "ens5"]
        );
    }

    #[test]
    fn family_and_one_address_per_interface() {
        let all = ifs(&[
            ("eth0", "fe80::1"),
            ("eth0", "2001:db8::2"),
            ("eth0", "10.0.0.2"),
            ("eth1", "::1"),
        ]);
        assert_eq!(
            select(&all, None, None)[0].addr,
            "2001:db8::2".parse::<IpAddr>().unwrap()
        );
        let v4 = select(&all, None, Some(Family::V4));
        assert_eq!(v4.len(), 1);
        assert_eq!(v4[0].addr, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(Family::parse("AF_INET6"), Some(Family::V6));
        assert_eq!(Family::parse("inet"), None);
    }

    #[test]
    fn lists_real_interfaces() {
        let all = list_interfaces().unwrap();
        assert!(all.iter().any(|i| i.name == "lo"), "{all:?}");
    }
}
