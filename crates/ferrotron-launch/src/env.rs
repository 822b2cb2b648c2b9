//! Where this process sits in a multi-process run, read from its launcher's environment.
//!
//! Users outgrow one machine through Slurm (`srun recipe run ...`) or torchrun-style launchers
//! (`recipe run --nproc-per-node` is one, on a single machine), so a rank learns its place the
//! way PyTorch programs do:
//! `RANK`/`WORLD_SIZE`/`LOCAL_RANK`/`MASTER_ADDR`/`MASTER_PORT` when a torchrun-style launcher
//! set them, otherwise Slurm's own task variables. Slurm is recognised by `SLURM_STEP_ID`, which
//! only `srun` steps have: `recipe run` typed into a batch script without `srun` sees
//! `SLURM_PROCID=0` and `SLURM_NTASKS=8` but is one process, and must stay a one-process run.
//! Under Slurm the rendezvous address is the first node of the step and the port is derived
//! from the job id, so every task of a job computes the same address without talking, and two
//! jobs sharing a node do not collide; `MASTER_ADDR`/`MASTER_PORT` override both.

use std::time::Duration;

use ferrotron_dist::{DEFAULT_CONNECT_TIMEOUT, TcpConfig};
use ferrotron_recipe::{Cluster, GpuKind};

use crate::slurm::{HostlistError, expand_hostlist};

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// A task of an `srun` step.
    Slurm,
    /// `RANK`/`WORLD_SIZE` set by torchrun or anything that speaks its protocol.
    Torchrun,
}

/// This process's place in a multi-process run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub launcher: Launcher,
    pub rank: u32,
    pub world_size: u32,
    /// Index among the ranks on this node (picks the GPU).
    pub local_rank: u32,
    pub nodes: u32,
    pub tasks_per_node: u32,
    /// The step's nodes, expanded (Slurm); the master alone for torchrun.
    pub hosts: Vec<String>,
    /// Where rank 0 listens.
    pub master_addr: String,
    pub master_port: u16,
    /// Slurm's job id (each array task has its own).
    pub job_id: Option<u64>,
}

/// Why the launch environment is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("{launcher} launch: {var} is not set")]
    Missing {
        launcher: &'static str,
        var: &'static str,
    },
    #[error("{var}={value:?}: {why}")]
    Invalid {
        var: &'static str,
        value: String,
        why: String,
    },
    #[error(transparent)]
    Hostlist(#[from] HostlistError),
    #[error(
        "{world_size} tasks on {nodes} nodes are not the same number per node; \
         a plan needs nodes × tasks per node (use --ntasks-per-node)"
    )]
    Uneven { world_size: u32, nodes: u32 },
}

/// First port of the range job ids map into (below Linux's ephemeral ports, 32768 up).
pub const PORT_BASE: u16 = 15000;
/// Size of that range.
pub const PORT_SPAN: u64 = 15000;

/// The rendezvous port of Slurm job `job_id`.
pub fn port_for_job(job_id: u64) -> u16 {
    PORT_BASE + (job_id % PORT_SPAN) as u16
}

impl LaunchEnv {
    /// Reads the process environment; `None` when no launcher started this process (a plain
    /// single-process run).
    pub fn detect() -> Result<Option<LaunchEnv>, LaunchError> {
        LaunchEnv::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`LaunchEnv::detect`], from any variable source (tests, a saved environment).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<LaunchEnv>, LaunchError> {
        let vars = Vars(&var);
        if var("RANK").is_some() && var("WORLD_SIZE").is_some() {
            return torchrun(&vars).map(Some);
        }
        if var("SLURM_STEP_ID").is_some() && var("SLURM_PROCID").is_some() {
            return slurm(&vars).map(Some);
        }
        Ok(None)
    }

    /// The rendezvous settings of a [`ferrotron_dist::TcpComm`] world for this rank.
    pub fn tcp_config(&self, timeout: Duration) -> TcpConfig {
        TcpConfig {
            timeout,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            ..TcpConfig::new(
                self.rank,
                self.world_size,
                &self.master_addr,
                self.master_port,
            )
        }
    }

    /// The cluster this world is: `nodes` × `tasks_per_node` devices of kind `gpu`.
    pub fn cluster(&self, gpu: GpuKind) -> Cluster {
        Cluster {
            nodes: self.nodes,
            gpus_per_node: self.tasks_per_node,
            gpu,
        }
    }
}

struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    fn number(&self, launcher: &'static str, name: &'static str) -> Result<u64, LaunchError> {
        let value = self.get(name).ok_or(LaunchError::Missing {
            launcher,
            var: name,
        })?;
        parse_number(name, &value)
    }

    fn optional_number(&self, name: &'static str) -> Result<Option<u64>, LaunchError> {
        self.get(name).map(|v| parse_number(name, &v)).transpose()
    }
}

fn parse_number(var: &'static str, value: &str) -> Result<u64, LaunchError> {
    value.trim().parse().map_err(|_| LaunchError::Invalid {
        var,
        value: value.to_owned(),
        why: "not a whole number".to_owned(),
    })
}

fn to_u32(var: &'static str, value: u64) -> Result<u32, LaunchError> {
    u32::try_from(value).map_err(|_| LaunchError::Invalid {
        var,
        value: value.to_string(),
        why: "too large".to_owned(),
    })
}

fn check_rank(var: &'static str, rank: u32, size_var: &str, size: u32) -> Result<(), LaunchError> {
    if size == 0 {
        return Err(LaunchError::Invalid {
            var,
            value: rank.to_string(),
            why: format!("{size_var} is 0"),
        });
    }
    if rank >= size {
        return Err(LaunchError::Invalid {
            var,
            value: rank.to_string(),
            why: format!("not below {size_var}={size}"),
        });
    }
    Ok(())
}

fn port(value: u64) -> Result<u16, LaunchError> {
    u16::try_from(value)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(LaunchError::Invalid {
            var: "MASTER_PORT",
            value: value.to_string(),
            why: "not a port (1-65535)".to_owned(),
        })
}

fn torchrun(vars: &Vars<'_>) -> Result<LaunchEnv, LaunchError> {
    const WHO: &str = "torchrun-style";
    let rank = to_u32("RANK", vars.number(WHO, "RANK")?)?;
    let world_size = to_u32("WORLD_SIZE", vars.number(WHO, "WORLD_SIZE")?)?;
    check_rank("RANK", rank, "WORLD_SIZE", world_size)?;
    let local_rank = to_u32(
        "LOCAL_RANK",
        vars.optional_number("LOCAL_RANK")?.unwrap_or(0),
    )?;
    let tasks_per_node = match vars.optional_number("LOCAL_WORLD_SIZE")? {
        Some(local) => to_u32("LOCAL_WORLD_SIZE", local)?,
        None => world_size,
    };
    check_rank("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", tasks_per_node)?;
    if world_size % tasks_per_node != 0 {
        return Err(LaunchError::Uneven {
            world_size,
            nodes: world_size.div_ceil(tasks_per_node),
        });
    }
    let master_addr = vars.get("MASTER_ADDR").ok_or(LaunchError::Missing {
        launcher: WHO,
        var: "MASTER_ADDR",
    })?;
    let master_port = port(vars.number(WHO, "MASTER_PORT")?)?;
    Ok(LaunchEnv {
        launcher: Launcher::Torchrun,
        rank,
        world_size,
        local_rank,
        nodes: world_size / tasks_per_node,
        tasks_per_node,
        hosts: vec![master_addr.clone()],
        master_addr,
        master_port,
        job_id: None,
    })
}

fn slurm(vars: &Vars<'_>) -> Result<LaunchEnv, LaunchError> {
    const WHO: &str = "Slurm";
    let rank = to_u32("SLURM_PROCID", vars.number(WHO, "SLURM_PROCID")?)?;
    // The step's task count; SLURM_NTASKS is the job's in older Slurm versions.
    let world_size = match vars.optional_number("SLURM_STEP_NUM_TASKS")? {
        Some(n) => to_u32("SLURM_STEP_NUM_TASKS", n)?,
        None => to_u32("SLURM_NTASKS", vars.number(WHO, "SLURM_NTASKS")?)?,
    };
    check_rank("SLURM_PROCID", rank, "the number of tasks", world_size)?;
    let local_rank = to_u32("SLURM_LOCALID", vars.number(WHO, "SLURM_LOCALID")?)?;
    let nodelist = vars
        .get("SLURM_STEP_NODELIST")
        .or_else(|| vars.get("SLURM_JOB_NODELIST"))
        .ok_or(LaunchError::Missing {
            launcher: WHO,
            var: "SLURM_JOB_NODELIST",
        })?;
    let hosts = expand_hostlist(&nodelist)?;
    let nodes = match vars.optional_number("SLURM_STEP_NUM_NODES")? {
        Some(n) => to_u32("SLURM_STEP_NUM_NODES", n)?,
        None => hosts.len() as u32,
    };
    if nodes == 0 || world_size % nodes != 0 {
        return Err(LaunchError::Uneven { world_size, nodes });
    }
    let job_id = vars.optional_number("SLURM_JOB_ID")?;
    let master_addr = vars.get("MASTER_ADDR").unwrap_or_else(|| hosts[0].clone());
    let master_port = match vars.optional_number("MASTER_PORT")? {
        Some(p) => port(p)?,
        None => port_for_job(job_id.ok_or(LaunchError::Missing {
            launcher: WHO,
            var: "SLURM_JOB_ID",
        })?),
    };
    Ok(LaunchEnv {
        launcher: Launcher::Slurm,
        rank,
        world_size,
        local_rank,
        nodes,
        tasks_per_node: world_size / nodes,
        hosts,
        master_addr,
        master_port,
        job_id,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>, LaunchError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        LaunchEnv::from_vars(|name| map.get(name).cloned())
    }

    const SRUN_TASK: [(&str, &str); 8] = [
        ("SLURM_JOB_ID", "123456"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_STEP_NUM_TASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_STEP_NODELIST", "gpu-a[07-08],gpu-b[1-2]"),
        ("SLURM_STEP_NUM_NODES", "4"),
    ];

    #[test]
    fn an_srun_task_knows_its_place_and_the_master() {
        let launch = env(&SRUN_TASK).expect("valid").expect("under srun");
        assert_eq!(
            launch,
            LaunchEnv {
                launcher: Launcher::Slurm,
                rank: 5,
                world_size: 8,
                local_rank: 1,
                nodes: 4,
                tasks_per_node: 2,
                hosts: ["gpu-a07", "gpu-a08", "gpu-b1", "gpu-b2"]
                    .map(String::from)
                    .to_vec(),
                master_addr: "gpu-a07".to_owned(),
                master_port: 15000 + (123456 % 15000) as u16,
                job_id: Some(123456),
            }
        );
        let config = launch.tcp_config(Duration::from_secs(9));
        assert_eq!(
            (
                config.rank,
                config.world_size,
                config.master_addr.as_str(),
                config.timeout
            ),
            (5, 8, "gpu-a07", Duration::from_secs(9))
        );
        assert_eq!(launch.cluster(GpuKind::Cpu).world_size(), 8);
    }

    #[test]
    fn master_variables_override_the_derived_address() {
        let mut vars = SRUN_TASK.to_vec();
        vars.extend([("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")]);
        let launch = env(&vars).expect("valid").expect("under srun");
        assert_eq!(
            (launch.master_addr.as_str(), launch.master_port),
            ("10.0.0.1", 29500)
        );
    }

    #[test]
    fn a_batch_script_without_srun_is_a_single_process() {
        // What the batch step sees: SLURM_PROCID and SLURM_NTASKS, but no step id.
        let batch = [
            ("SLURM_JOB_ID", "1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_NODELIST", "node[1-4]"),
        ];
        assert_eq!(env(&batch), Ok(None));
        assert_eq!(env(&[]), Ok(None));
    }

    #[test]
    fn older_slurm_without_step_variables_uses_the_job_ones() {
        let launch = env(&[
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "localhost"),
        ])
        .expect("valid")
        .expect("under srun");
        assert_eq!(
            (launch.nodes, launch.tasks_per_node, launch.master_port),
            (1, 2, 15077)
        );
    }

    #[test]
    fn torchrun_variables_win() {
        let mut vars = SRUN_TASK.to_vec();
        vars.extend([
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "head"),
            ("MASTER_PORT", "29400"),
        ]);
        let launch = env(&vars).expect("valid").expect("torchrun");
        assert_eq!(launch.launcher, Launcher::Torchrun);
        assert_eq!(
            (
                launch.rank,
                launch.world_size,
                launch.local_rank,
                launch.nodes,
                launch.tasks_per_node
            ),
            (3, 4, 1, 2, 2)
        );
        assert_eq!(
            (launch.master_addr.as_str(), launch.master_port),
            ("head", 29400)
        );
    }

    #[test]
    fn bad_environments_are_explained() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
                "torchrun-style launch: MASTER_ADDR is not set",
            ),
            (
                &[("RANK", "2"), ("WORLD_SIZE", "2")],
                "RANK=\"2\": not below WORLD_SIZE=2",
            ),
            (
                &[("RANK", "x"), ("WORLD_SIZE", "2")],
                "RANK=\"x\": not a whole number",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", "70000"),
                ],
                "MASTER_PORT=\"70000\": not a port (1-65535)",
            ),
            (
                &[
                    ("SLURM_STEP_ID", "0"),
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "3"),
                    ("SLURM_LOCALID", "0"),
                    ("SLURM_JOB_ID", "5"),
                    ("SLURM_JOB_NODELIST", "n[1-2]"),
                ],
                "3 tasks on 2 nodes are not the same number per node; a plan needs nodes × tasks per node (use --ntasks-per-node)",
            ),
        ];
        for (vars, message) in cases {
            assert_eq!(
                env(vars).map_err(|e| e.to_string()),
                Err(message.to_owned())
            );
        }
    }

    #[test]
    fn ports_stay_in_their_range() {
        for job in [0, 1, 14_999, 15_000, u64::MAX] {
            let port = port_for_job(job);
            assert!((15000..30000).contains(&port), "{job} → {port}");
        }
    }
}
