//! A typed, async Proxmox VE API client.
