//! The banlieue controller: standalone VirtualMachines over any provider.
