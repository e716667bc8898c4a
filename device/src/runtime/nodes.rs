//! How the ranks of a context group into nodes (`SymmContext::node_size`): contiguous groups of
//! `size` ranks, rank r on node `r / size`. Peers on this rank's node are reached by loads and
//! stores; peers on other nodes only through `transport::remote`.

use crate::abi::SymmContext;
use crate::runtime::mem::div32;

/// This rank's place among the nodes of its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nodes {
    /// Ranks per node.
    pub size: usize,
    /// Nodes in the context.
    pub count: usize,
    /// This rank's node.
    pub node: usize,
    /// This rank's index within its node.
    pub local: usize,
}

impl Nodes {
    /// The grouping of `c`, whose `node_size` the context check admitted (0, or a divisor of the
    /// world size).
    #[inline(always)]
    pub fn of(c: &SymmContext) -> Self {
        let world = c.world_size as usize;
        let size = match c.node_size as usize {
            0 => world,
            s => s.min(world),
        };
        let node = div32(c.rank as usize, size);
        Nodes {
            size,
            count: div32(world, size),
            node,
            local: c.rank as usize - node * size,
        }
    }

    /// Whether the context spans more than one node.
    #[inline(always)]
    pub fn multi(&self) -> bool {
        self.count > 1
    }

    /// The first rank of this rank's node.
    #[inline(always)]
    pub fn first(&self) -> usize {
        self.node * self.size
    }

    /// The rank with local index `local` on node `node`.
    #[inline(always)]
    pub fn rank(&self, node: usize, local: usize) -> usize {
        node * self.size + local
    }

    /// Whether `rank` is on this rank's node.
    #[inline(always)]
    pub fn same_node(&self, rank: usize) -> bool {
        rank >= self.first() && rank < self.first() + self.size
    }
}

/// Whether `node_size` describes a grouping of `world` ranks: 0 (one node) or a divisor.
#[inline(always)]
pub fn valid(node_size: u32, world: i32) -> bool {
    // Bit s of DIVISORS[w] says whether s divides w: a table instead of `%`, whose division code
    // in every function's prologue cost registers (tile_reduce_scatter spilled on sm_80/100).
    const DIVISORS: [u16; 9] = [0, 0x2, 0x6, 0xa, 0x16, 0x22, 0x4e, 0x82, 0x116];
    node_size == 0
        || (node_size as i32 <= world
            && DIVISORS
                .get(world as usize)
                .is_some_and(|d| d & (1 << node_size) != 0))
}
