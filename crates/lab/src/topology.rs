//! What a lab is: its name, its hosts with their addresses and links, and where
//! its state lives. Pure data and naming rules; no side effects.

use anyhow::{bail, Result};
use longhaul_netem::{HostConfig, HubConfig, LinkSpec, SiteConfig};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// The lab used when `--name` is not given.
pub const DEFAULT_LAB: &str = "default";
/// Every namespace the lab creates starts with this.
pub const NS_PREFIX: &str = "lh-";
/// The TUN port's name inside each host.
pub const PORT_NAME: &str = "lh0";
/// Hosts get 10.77.0.1, .2, ... in the order given.
pub const SUBNET: [u8; 3] = [10, 77, 0];
/// Most hosts a lab may have (addresses up to 10.77.0.200).
pub const MAX_HOSTS: usize = 200;

/// Where labs keep their state (config, pids, control socket, logs).
pub fn state_root() -> PathBuf {
    std::env::var_os("LONGHAUL_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/longhaul/lab"))
}

/// A lab name: 1–12 of [a-z0-9], so `lh-NAME-HOST` stays unambiguous.
pub fn check_lab_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 12
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        bail!("lab name '{name}': use 1 to 12 lowercase letters or digits");
    }
    Ok(())
}

/// A host name: 1–20 of [a-z0-9-], starting with a letter (it is also a DNS name).
pub fn check_host_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 20
        && name.as_bytes()[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        bail!("host name '{name}': use 1 to 20 of a-z, 0-9 and '-', starting with a letter");
    }
    Ok(())
}

/// Everything needed to build (and tear down) a lab.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabConfig {
    /// Lab name (1–12 of a-z0-9): names the namespaces (`lh-NAME-HOST`) and
    /// the state directory.
    pub name: String,
    /// The hosts in the order given, the N-th at 10.77.0.N; the first is the
    /// hub host, with an ideal link unless `--link-to` gives it one.
    pub hosts: Vec<HostConfig>,
    /// Seed of the emulator's random choices (losses, jitter): the same seed
    /// and traffic replay the same losses.
    pub seed: u64,
    /// MTU of every host's TUN port, bytes (576 to 9000).
    pub mtu: usize,
    /// Where the emulator writes a pcap of every packet the hosts send (the
    /// CLI makes `--pcap` absolute, as the emulator runs elsewhere); `None`
    /// (the default): no capture.
    pub pcap: Option<PathBuf>,
    /// Bytes kept of each captured packet (68 unless `--snaplen` says).
    pub snaplen: u32,
    /// Ports pass TSO/USO aggregates (see `longhaul_netem::gso`).
    #[serde(default = "yes")]
    pub offload: bool,
    /// The links' schedule clock (outages, rate steps) stays held when the
    /// lab comes up, until [`crate::ops::schedule`] starts it: `lab run`
    /// starts it as each tool starts. False (the default): `up` starts it
    /// once the lab is ready.
    #[serde(default)]
    pub schedule_held: bool,
    /// Sites: hosts behind one shared link (`--site NAME=H1,H2`, its link
    /// given by `--link-to NAME=SPEC`).
    #[serde(default)]
    pub sites: Vec<SiteConfig>,
}

fn yes() -> bool {
    true
}

/// `--link`, `--link-to` and `--site` as given.
pub struct LinkArgs<'a> {
    /// Applies to every host but the first (the hub host), which is ideal by default.
    pub default: Option<&'a str>,
    /// HOST=SPEC overrides, and SITE=SPEC for a site's shared link.
    pub per_host: &'a [String],
    /// NAME=H1,H2,...: hosts behind one shared link (ideal unless
    /// `per_host` gives NAME a SPEC).
    pub sites: &'a [String],
}

impl LabConfig {
    /// Builds a config from the command line's host list and links.
    pub fn new(
        name: &str,
        hosts: &[String],
        links: LinkArgs,
        seed: u64,
        mtu: usize,
    ) -> Result<Self> {
        check_lab_name(name)?;
        if hosts.len() < 2 {
            bail!("a lab needs at least two hosts (e.g. --hosts srv,cli)");
        }
        if hosts.len() > MAX_HOSTS {
            bail!("at most {MAX_HOSTS} hosts");
        }
        if !(576..=9000).contains(&mtu) {
            bail!("MTU {mtu} out of range (576 to 9000)");
        }
        for (i, h) in hosts.iter().enumerate() {
            check_host_name(h)?;
            if hosts[..i].contains(h) {
                bail!("host '{h}' is listed twice");
            }
        }
        let default: LinkSpec = match links.default {
            Some(s) => s.parse().map_err(|e| anyhow::anyhow!("--link: {e}"))?,
            None => LinkSpec::default(),
        };
        let mut cfg_hosts: Vec<HostConfig> = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| HostConfig {
                name: h.clone(),
                addr: Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], i as u8 + 1),
                link: if i == 0 {
                    LinkSpec::default()
                } else {
                    default.clone()
                },
            })
            .collect();
        let mut sites: Vec<SiteConfig> = Vec::new();
        for arg in links.sites {
            let Some((name, members)) = arg.split_once('=') else {
                bail!("--site '{arg}': expected NAME=HOST,HOST,... (e.g. src=dtn1,dtn2)");
            };
            check_host_name(name).map_err(|e| anyhow::anyhow!("--site: {e}"))?;
            if hosts.iter().any(|h| h == name) || sites.iter().any(|s| s.name == name) {
                bail!("--site '{arg}': '{name}' already names a host or a site");
            }
            let mut ports = Vec::new();
            for m in members.split(',') {
                let Some(i) = hosts.iter().position(|h| h == m) else {
                    bail!(
                        "--site '{arg}': no host '{m}' (hosts: {})",
                        hosts.join(", ")
                    );
                };
                if sites.iter().any(|s| s.ports.contains(&(i as u16)))
                    || ports.contains(&(i as u16))
                {
                    bail!("--site '{arg}': host '{m}' is in a site already");
                }
                ports.push(i as u16);
            }
            sites.push(SiteConfig {
                name: name.to_string(),
                ports,
                link: LinkSpec::default(),
            });
        }
        for arg in links.per_host {
            let Some((host, spec)) = arg.split_once('=') else {
                bail!("--link-to '{arg}': expected HOST=SPEC (e.g. cli1='delay=35ms loss=1e-3')");
            };
            let parsed: LinkSpec = spec
                .parse()
                .map_err(|e| anyhow::anyhow!("--link-to {host}: {e}"))?;
            if let Some(site) = sites.iter_mut().find(|s| s.name == host) {
                site.link = parsed;
                continue;
            }
            let Some(h) = cfg_hosts.iter_mut().find(|h| h.name == host) else {
                bail!(
                    "--link-to '{arg}': no host or site '{host}' (hosts: {})",
                    hosts.join(", ")
                );
            };
            h.link = parsed;
        }
        Ok(LabConfig {
            name: name.to_string(),
            hosts: cfg_hosts,
            seed,
            mtu,
            pcap: None,
            snaplen: 68,
            offload: true,
            schedule_held: false,
            sites,
        })
    }

    /// The network namespace of `host` in this lab (`lh-NAME-HOST`).
    pub fn netns(&self, host: &str) -> String {
        netns_name(&self.name, host)
    }

    /// This lab's state directory, under [`state_root`].
    pub fn dir(&self) -> PathBuf {
        state_root().join(&self.name)
    }

    /// True when some host's link has outages or rate steps.
    pub fn has_schedule(&self) -> bool {
        self.hosts.iter().any(|h| h.link.has_schedule())
            || self.sites.iter().any(|s| s.link.has_schedule())
    }

    /// The host called `name`, if the lab has one.
    pub fn host(&self, name: &str) -> Option<&HostConfig> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The emulator's hub: these hosts, seed and MTU, `vnet_hdr` when
    /// `offload` is on, and a 1 GiB cap on packet buffers.
    pub fn hub_config(&self) -> HubConfig {
        HubConfig {
            hosts: self.hosts.clone(),
            sites: self.sites.clone(),
            seed: self.seed,
            mtu: self.mtu,
            vnet_hdr: self.offload,
            buffer_bytes: 1 << 30,
        }
    }

    /// `/etc/hosts` for `host`'s namespace: every host by name, and this
    /// machine's own hostname mapped to the host's address (some tools, like
    /// GridFTP, resolve their own name).
    pub fn hosts_file(&self, host: &str, machine: &str) -> String {
        let mut s = String::from("127.0.0.1\tlocalhost\n");
        for h in &self.hosts {
            let mut names = h.name.clone();
            if h.name == host && !machine.is_empty() && machine != h.name {
                names.push('\t');
                names.push_str(machine);
            }
            s.push_str(&format!("{}\t{names}\n", h.addr));
        }
        s
    }
}

/// The network namespace of `host` in lab `lab`: `lh-LAB-HOST`.
pub fn netns_name(lab: &str, host: &str) -> String {
    format!("{NS_PREFIX}{lab}-{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        list.split(',').map(String::from).collect()
    }

    #[test]
    fn first_host_is_ideal_and_others_get_the_link() {
        let per = vec!["cli2=delay=350ms".to_string()];
        let c = LabConfig::new(
            "t1",
            &hosts("srv,cli1,cli2"),
            LinkArgs {
                default: Some("delay=35ms loss=1e-3"),
                per_host: &per,
                sites: &[],
            },
            7,
            1500,
        )
        .unwrap();
        assert!(c.hosts[0].link.is_ideal());
        assert_eq!(c.hosts[1].link.down.delay_ns, 35_000_000);
        assert_eq!(c.hosts[2].link.up.delay_ns, 350_000_000);
        assert_eq!(c.hosts[2].addr, Ipv4Addr::new(10, 77, 0, 3));
        assert_eq!(c.netns("cli1"), "lh-t1-cli1");
        let hf = c.hosts_file("cli1", "box");
        assert!(hf.contains("10.77.0.1\tsrv\n"));
        assert!(hf.contains("10.77.0.2\tcli1\tbox\n"));
    }

    #[test]
    fn a_scheduled_link_is_seen_and_older_configs_read_back() {
        let c = LabConfig::new(
            "t2",
            &hosts("srv,cli"),
            LinkArgs {
                default: Some("rate=100M delay=35ms outage=20s@5s"),
                per_host: &[],
                sites: &[],
            },
            1,
            1500,
        )
        .unwrap();
        assert!(c.has_schedule() && !c.schedule_held);
        assert_eq!(c.hosts[1].link.down.schedule.outages.len(), 1);
        // The config round-trips through config.json, schedule included; a
        // config written before schedules existed reads as not held.
        let json = serde_json::to_value(&c).unwrap();
        let back: LabConfig = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, c);
        let mut old = json;
        old.as_object_mut().unwrap().remove("schedule_held");
        let old: LabConfig = serde_json::from_value(old).unwrap();
        assert!(!old.schedule_held);
        let plain = LabConfig::new(
            "t3",
            &hosts("srv,cli"),
            LinkArgs {
                default: Some("delay=35ms"),
                per_host: &[],
                sites: &[],
            },
            1,
            1500,
        )
        .unwrap();
        assert!(!plain.has_schedule());
    }

    #[test]
    fn bad_input_is_refused_with_the_reason() {
        let none = LinkArgs {
            default: None,
            per_host: &[],
            sites: &[],
        };
        let err = |name: &str, h: &str, links: LinkArgs| {
            LabConfig::new(name, &hosts(h), links, 0, 1500)
                .unwrap_err()
                .to_string()
        };
        assert!(err("Bad-Name", "a,b", none).contains("lab name"));
        let none = LinkArgs {
            default: None,
            per_host: &[],
            sites: &[],
        };
        assert!(err("x", "a", none).contains("at least two"));
        let none = LinkArgs {
            default: None,
            per_host: &[],
            sites: &[],
        };
        assert!(err("x", "a,a", none).contains("twice"));
        let none = LinkArgs {
            default: None,
            per_host: &[],
            sites: &[],
        };
        assert!(err("x", "a,9b", none).contains("host name"));
        let per = vec!["zz=delay=1ms".to_string()];
        let e = err(
            "x",
            "a,b",
            LinkArgs {
                default: None,
                per_host: &per,
                sites: &[],
            },
        );
        assert!(e.contains("no host or site 'zz'"), "{e}");
        let e = err(
            "x",
            "a,b",
            LinkArgs {
                default: Some("rate=fast"),
                per_host: &[],
                sites: &[],
            },
        );
        assert!(e.contains("--link"), "{e}");
    }

    #[test]
    fn sites_group_hosts_behind_a_link_of_their_own() {
        let per = vec!["src=rate=1G delay=35ms".to_string()];
        let sites = vec!["src=s1,s2".to_string(), "dst=d1,d2".to_string()];
        let c = LabConfig::new(
            "t",
            &hosts("s1,s2,d1,d2"),
            LinkArgs {
                default: None,
                per_host: &per,
                sites: &sites,
            },
            1,
            1500,
        )
        .unwrap();
        assert_eq!(c.sites.len(), 2);
        assert_eq!(c.sites[0].ports, [0, 1]);
        assert_eq!(c.sites[0].link.up.delay_ns, 35_000_000);
        assert_eq!(c.sites[1].ports, [2, 3]);
        assert_eq!(c.sites[1].link, LinkSpec::default());
        assert_eq!(c.hub_config().sites, c.sites);
        let bad = |sites: &[&str]| {
            let sites: Vec<String> = sites.iter().map(|s| s.to_string()).collect();
            let links = LinkArgs {
                default: None,
                per_host: &[],
                sites: &sites,
            };
            LabConfig::new("t", &hosts("s1,s2,d1"), links, 1, 1500)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(&["a=s1,x"]).contains("no host 'x'"));
        assert!(bad(&["a=s1", "b=s1"]).contains("in a site already"));
        assert!(bad(&["s1=s2"]).contains("already names a host"));
        assert!(bad(&["a"]).contains("expected NAME=HOST"));
    }
}
