//! How the ranks of a context group into nodes: contiguous groups of `size` ranks, rank r on
//! node `r / size` (`SymmContext::node_size` of a multi-node context; one node for the other
//! kinds). Peers on this rank's node are reached by loads and stores; peers on other nodes only
//! through `transport::remote`.

use crate::abi::{backend, SymmContext};
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
    /// The grouping of `c`, which the context check admitted (`node_size` divides the world of
    /// a multi-node context).
    #[inline(always)]
    pub fn of(c: &SymmContext) -> Self {
        let world = c.world_size as usize;
        let size = if c.backend == backend::NVSHMEM_MULTI_NODE {
            (c.node_size as usize).max(1).min(world)
        } else {
            world
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
