//! A loaded object: its programs (found by name and type, verified with the
//! verifier's log kept on refusal) and its maps (typed through aya, by name, with
//! errors that name the map; per-CPU sums; descriptors for raw access and mmap).

use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::{Array, Map, MapData, MapError, PerCpuArray, PerCpuValues};
use aya::programs::{PerfEvent, Program, ProgramError, SchedClassifier, SkLookup, TracePoint, Xdp};
use aya::{Ebpf, Pod};

use crate::error::{error_chain, is_permission_error, Error, Result};
use crate::rawmap::RawMap;

/// Largest frame a test run hands back by default (one page): what XDP and tc
/// programs may grow a frame to under BPF_PROG_TEST_RUN.
pub const TEST_FRAME_BYTES_MAX: usize = 4096;

/// One object file (clang -target bpf), its maps created, its programs not yet
/// loaded. Everything it holds (programs, links, maps) goes when it is dropped,
/// unless a link was detached or a map mapped by its own descriptor before.
pub struct Object {
    ebpf: Ebpf,
    label: &'static str,
}

/// Program types [`Object::load_program`] verifies (aya has no common trait).
pub trait Loadable {
    /// `BPF_PROG_LOAD` of this program.
    fn load_into_kernel(&mut self) -> std::result::Result<(), ProgramError>;
}

macro_rules! loadable {
    ($($t:ty),*) => {
        $(impl Loadable for $t {
            fn load_into_kernel(&mut self) -> std::result::Result<(), ProgramError> {
                self.load()
            }
        })*
    };
}
loadable!(Xdp, SchedClassifier, SkLookup, TracePoint, PerfEvent);

/// The outcome of one [`Object::test_run`].
#[derive(Debug, Clone)]
pub struct TestOutcome {
    /// The program's verdict (XDP action, tc action, ...).
    pub retval: u32,
    /// The frame as the program left it (empty if no output was asked for).
    pub frame: Vec<u8>,
    /// Run time of the program as the kernel measured it, ns.
    pub duration_ns: u32,
}

/// The descriptor of any map.
fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

impl Object {
    /// Parse `elf` (embedded with `aya::include_bytes_aligned!`) and create its maps.
    /// `label` names the program in every error ("the rmem XDP program"). No kernel
    /// BTF is read: the programs use no CO-RE relocations (offsets of kernel structures
    /// come from [`crate::btf`]), and parsing /sys/kernel/btf/vmlinux would cost tens
    /// of milliseconds of every start-up.
    pub fn load(label: &'static str, elf: &[u8]) -> Result<Object> {
        Object::load_sized(label, elf, &[])
    }

    /// As [`Object::load`], with the maps named in `max_entries` created with that many
    /// entries instead of the object's declared count (a large map sized to what the
    /// node configured; the program must still bound every index by the declared one).
    pub fn load_sized(
        label: &'static str,
        elf: &[u8],
        max_entries: &[(&str, u32)],
    ) -> Result<Object> {
        let mut loader = aya::EbpfLoader::new();
        loader.btf(None);
        for &(name, n) in max_entries {
            loader.map_max_entries(name, n);
        }
        let ebpf = loader.load(elf).map_err(|e| {
            Error::classify(label, "creating maps", &e, |detail| Error::Load {
                program: label,
                detail,
            })
        })?;
        Ok(Object { ebpf, label })
    }

    /// The label errors carry.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// aya's object, for what this type does not wrap (perf event attach, program info).
    pub fn ebpf(&self) -> &Ebpf {
        &self.ebpf
    }

    /// As [`Object::ebpf`], mutable.
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    fn missing(&self, kind: &'static str, name: &str, detail: String) -> Error {
        missing(self.label, kind, name, detail)
    }

    /// Program `name` as type `T` (`Xdp`, `SchedClassifier`, `SkLookup`, ...).
    pub fn program<'a, T>(&'a self, name: &str) -> Result<&'a T>
    where
        &'a T: TryFrom<&'a Program, Error = ProgramError>,
    {
        let p = self
            .ebpf
            .program(name)
            .ok_or_else(|| self.missing("program", name, String::new()))?;
        p.try_into()
            .map_err(|e: ProgramError| self.missing("program", name, e.to_string()))
    }

    /// Program `name` as type `T`, mutable.
    pub fn program_mut<'a, T>(&'a mut self, name: &str) -> Result<&'a mut T>
    where
        &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
    {
        let label = self.label;
        let p = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| missing(label, "program", name, String::new()))?;
        p.try_into()
            .map_err(|e: ProgramError| missing(label, "program", name, e.to_string()))
    }

    /// Load (verify) program `name` as type `T`. A verifier refusal is an
    /// [`Error::Load`] with the verifier's log (the kernel answers it with EACCES,
    /// which is not a lack of privilege here); other EPERM/EACCES are
    /// [`Error::NoPrivilege`].
    pub fn load_program<'a, T: Loadable>(&'a mut self, name: &str) -> Result<&'a mut T>
    where
        &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
    {
        let label = self.label;
        let p: &mut T = self.program_mut(name)?;
        p.load_into_kernel()
            .map_err(|e| load_error(label, &format!("loading {name}"), e))?;
        Ok(p)
    }

    /// Map `name`.
    pub fn map(&self, name: &str) -> Result<&Map> {
        self.ebpf
            .map(name)
            .ok_or_else(|| self.missing("map", name, String::new()))
    }

    /// Map `name`, mutable.
    pub fn map_mut(&mut self, name: &str) -> Result<&mut Map> {
        let label = self.label;
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| missing(label, "map", name, String::new()))
    }

    /// Map `name` as aya's typed view `M` (`Array<&MapData, V>`, `HashMap<&MapData,
    /// K, V>`, `PerCpuArray<&MapData, V>`, ...).
    pub fn typed<'a, M>(&'a self, name: &str) -> Result<M>
    where
        M: TryFrom<&'a Map, Error = MapError>,
    {
        let m = self.map(name)?;
        M::try_from(m).map_err(|e| self.missing("map", name, e.to_string()))
    }

    /// Map `name` as aya's typed view `M` over `&mut MapData` (to write).
    pub fn typed_mut<'a, M>(&'a mut self, name: &str) -> Result<M>
    where
        M: TryFrom<&'a mut Map, Error = MapError>,
    {
        let label = self.label;
        let m = self.map_mut(name)?;
        M::try_from(m).map_err(|e| missing(label, "map", name, e.to_string()))
    }

    /// Element `index` of array map `name`.
    pub fn array_get<V: Pod>(&self, name: &str, index: u32) -> Result<V> {
        let a: Array<&MapData, V> = self.typed(name)?;
        a.get(&index, 0)
            .map_err(|e| Error::map(self.label, &format!("reading {name}[{index}]"), &e))
    }

    /// Write element `index` of array map `name`; `step` names the write in errors.
    pub fn array_set<V: Pod>(
        &mut self,
        name: &str,
        index: u32,
        value: V,
        step: &str,
    ) -> Result<()> {
        let label = self.label;
        let mut a: Array<&mut MapData, V> = self.typed_mut(name)?;
        a.set(index, value, 0)
            .map_err(|e| Error::map(label, &format!("{step} ({name}[{index}])"), &e))
    }

    /// The per-CPU values of element `index` of per-CPU array `name`.
    pub fn per_cpu<V: Pod>(&self, name: &str, index: u32) -> Result<PerCpuValues<V>> {
        let a: PerCpuArray<&MapData, V> = self.typed(name)?;
        a.get(&index, 0)
            .map_err(|e| Error::map(self.label, &format!("reading {name}[{index}]"), &e))
    }

    /// Counter `index` of per-CPU array `name` summed over CPUs (wrapping, as the
    /// kernel's adds do).
    pub fn per_cpu_sum(&self, name: &str, index: u32) -> Result<u64> {
        Ok(self
            .per_cpu::<u64>(name, index)?
            .iter()
            .copied()
            .fold(0, u64::wrapping_add))
    }

    /// Counters `0..n` of per-CPU array `name`, each summed over CPUs.
    pub fn per_cpu_sums(&self, name: &str, n: u32) -> Result<Vec<u64>> {
        let a: PerCpuArray<&MapData, u64> = self.typed(name)?;
        (0..n)
            .map(|i| {
                a.get(&i, 0)
                    .map(|v| v.iter().copied().fold(0, u64::wrapping_add))
                    .map_err(|e| Error::map(self.label, &format!("reading {name}[{i}]"), &e))
            })
            .collect()
    }

    /// The descriptor of map `name`, valid while the object lives (to mmap a
    /// `BPF_F_MMAPABLE` array, or to hand the map to another process).
    pub fn map_fd(&self, name: &str) -> Result<BorrowedFd<'_>> {
        Ok(map_data(self.map(name)?).fd().as_fd())
    }

    /// Map `name` for element commands through its own descriptor ([`RawMap`]:
    /// usable from `&self` and from other threads, and after the object is gone).
    pub fn raw_map(&self, name: &str) -> Result<RawMap> {
        let data = map_data(self.map(name)?);
        let info = data
            .info()
            .map_err(|e| Error::map(self.label, &format!("{name} info"), &e))?;
        let fd =
            data.fd().as_fd().try_clone_to_owned().map_err(|e| {
                Error::os(self.label, &format!("duplicating {name}'s descriptor"), e)
            })?;
        Ok(RawMap::new(
            fd,
            name,
            info.key_size() as usize,
            info.value_size() as usize,
        ))
    }

    /// Run loaded program `name` once on `frame` with BPF_PROG_TEST_RUN (packet
    /// tests; the maps are the live ones), with room for an output frame of
    /// `out_bytes_max` (0: the output is not asked for).
    pub fn test_run(&self, name: &str, frame: &[u8], out_bytes_max: usize) -> Result<TestOutcome> {
        let p = self
            .ebpf
            .program(name)
            .ok_or_else(|| self.missing("program", name, String::new()))?;
        let fd = p.fd().map_err(|e| Error::Load {
            program: self.label,
            detail: format!("{name}: {e}"),
        })?;
        let mut out = vec![0u8; out_bytes_max];
        let r =
            farside_bpfbuild::prog_test_run(fd.as_fd(), frame, &mut out).map_err(Error::TestRun)?;
        out.truncate(r.data_out_len);
        Ok(TestOutcome {
            retval: r.retval,
            frame: out,
            duration_ns: r.duration_ns,
        })
    }
}

fn missing(program: &'static str, kind: &'static str, name: &str, detail: String) -> Error {
    Error::Missing {
        program,
        kind,
        name: name.to_string(),
        detail,
    }
}

/// A program's load error: a verifier refusal keeps its log.
pub(crate) fn load_error(label: &'static str, step: &str, e: ProgramError) -> Error {
    let verifier = matches!(e, ProgramError::LoadError { .. });
    if is_permission_error(&e) && !verifier {
        Error::NoPrivilege {
            program: label,
            step: step.to_string(),
        }
    } else {
        Error::Load {
            program: label,
            detail: format!("{step}: {}", error_chain(&e)),
        }
    }
}
