package main

// vCenter's privilege checks, which govmomi's simulator does not make: with -role-user, the
// sessions of that user may call a method only when the role (-role-privileges) holds every
// privilege vSphere's API reference ("Required Privileges" of each method) names for it; any
// other user is unrestricted (the tests' own set-up). A refusal is vCenter's NoPermission fault
// naming the object and the first missing privilege.
//
// Covered: the methods banlieue's vSphere client calls. Reading the inventory (property
// collector, views, searches, sessions) needs System.View/System.Read, which every role has.
// Not covered: the vAPI REST endpoints (tagging), whose privileges are checked nowhere here.

import (
	"sort"
	"strings"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// roleCheck holds the restricted user and the privileges its role grants.
type roleCheck struct {
	user    string
	granted map[string]bool
}

func newRoleCheck(user, privileges string) *roleCheck {
	granted := map[string]bool{"System.Anonymous": true, "System.View": true, "System.Read": true}
	for _, p := range strings.Split(privileges, ",") {
		if p = strings.TrimSpace(p); p != "" {
			granted[p] = true
		}
	}
	return &roleCheck{user: user, granted: granted}
}

// handle is the registry's method hook: a fault for a call the role does not allow.
func (r *roleCheck) handle(ctx *simulator.Context, m *simulator.Method) (mo.Reference, types.BaseMethodFault) {
	if ctx.Session == nil || ctx.Session.UserName != r.user {
		return nil, nil
	}
	for _, p := range required(ctx, m) {
		if !r.granted[p] {
			this := m.This
			return nil, &types.NoPermission{Object: &this, PrivilegeId: p}
		}
	}
	return nil, nil
}

// required lists the privileges vSphere asks of method m on its object (sorted, unique).
func required(ctx *simulator.Context, m *simulator.Method) []string {
	set := map[string]bool{}
	add := func(ps ...string) {
		for _, p := range ps {
			set[p] = true
		}
	}
	switch body := m.Body.(type) {
	case *types.CloneVM_Task:
		// A template is deployed, a virtual machine cloned.
		if vm, ok := ctx.Map.Get(m.This).(*simulator.VirtualMachine); ok && vm.Config != nil && vm.Config.Template {
			add("VirtualMachine.Provisioning.DeployTemplate")
		} else {
			add("VirtualMachine.Provisioning.Clone")
		}
		add("VirtualMachine.Inventory.CreateFromExisting", "Resource.AssignVMToPool", "Datastore.AllocateSpace")
		if body.Spec.Config != nil {
			add(reconfigure(body.Spec.Config)...)
		}
		add(assignedNetworks(body.Spec.Location.DeviceChange)...)
	case *types.ReconfigVM_Task:
		add(reconfigure(&body.Spec)...)
	case *types.Rename_Task:
		if m.This.Type == "VirtualMachine" {
			add("VirtualMachine.Config.Rename")
		} else {
			add("Folder.Rename")
		}
	case *types.PowerOnVM_Task:
		add("VirtualMachine.Interact.PowerOn")
	case *types.PowerOffVM_Task, *types.ShutdownGuest:
		add("VirtualMachine.Interact.PowerOff")
	case *types.ResetVM_Task, *types.RebootGuest:
		add("VirtualMachine.Interact.Reset")
	case *types.Destroy_Task:
		switch m.This.Type {
		case "VirtualMachine":
			add("VirtualMachine.Inventory.Delete")
		case "Folder":
			add("Folder.Delete")
		default:
			add("System.Read")
		}
	case *types.MarkAsTemplate:
		add("VirtualMachine.Provisioning.MarkAsTemplate")
	case *types.MarkAsVirtualMachine:
		add("VirtualMachine.Provisioning.MarkAsVM", "Resource.AssignVMToPool")
	case *types.ImportVApp:
		// And what creating its virtual machine asks (CreateVM_Task's privileges).
		add("VApp.Import", "VirtualMachine.Inventory.Create", "Resource.AssignVMToPool", "Datastore.AllocateSpace")
	case *types.CreateFolder:
		add("Folder.Create")
	case *types.UnregisterVM:
		add("VirtualMachine.Inventory.Unregister")
	case *types.DeleteDatastoreFile_Task, *types.MakeDirectory:
		add("Datastore.FileManagement")
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// reconfigure lists what a VirtualMachineConfigSpec asks for, as ReconfigVM_Task's reference
// page lists it per changed property.
func reconfigure(spec *types.VirtualMachineConfigSpec) []string {
	var ps []string
	if spec.NumCPUs != 0 || spec.NumCoresPerSocket != nil {
		ps = append(ps, "VirtualMachine.Config.CPUCount")
	}
	if spec.MemoryMB != 0 {
		ps = append(ps, "VirtualMachine.Config.Memory")
	}
	if len(spec.ExtraConfig) > 0 {
		ps = append(ps, "VirtualMachine.Config.AdvancedConfig")
	}
	if spec.Name != "" {
		ps = append(ps, "VirtualMachine.Config.Rename")
	}
	if spec.Annotation != "" {
		ps = append(ps, "VirtualMachine.Config.Annotation")
	}
	if spec.CpuAllocation != nil || spec.MemoryAllocation != nil || spec.MemoryReservationLockedToMax != nil {
		ps = append(ps, "VirtualMachine.Config.Resource")
	}
	if spec.Firmware != "" || spec.BootOptions != nil || spec.Flags != nil || spec.NestedHVEnabled != nil || spec.CpuFeatureMask != nil {
		ps = append(ps, "VirtualMachine.Config.Settings")
	}
	for _, change := range spec.DeviceChange {
		c := change.GetVirtualDeviceConfigSpec()
		_, disk := c.Device.(*types.VirtualDisk)
		switch {
		case disk && c.Operation == types.VirtualDeviceConfigSpecOperationAdd && c.FileOperation == types.VirtualDeviceConfigSpecFileOperationCreate:
			ps = append(ps, "VirtualMachine.Config.AddNewDisk", "Datastore.AllocateSpace")
		case disk && c.Operation == types.VirtualDeviceConfigSpecOperationAdd:
			ps = append(ps, "VirtualMachine.Config.AddExistingDisk")
		case disk && c.Operation == types.VirtualDeviceConfigSpecOperationRemove:
			ps = append(ps, "VirtualMachine.Config.RemoveDisk")
		case disk && c.Operation == types.VirtualDeviceConfigSpecOperationEdit:
			ps = append(ps, "VirtualMachine.Config.DiskExtend", "Datastore.AllocateSpace")
		case c.Operation == types.VirtualDeviceConfigSpecOperationEdit:
			ps = append(ps, "VirtualMachine.Config.EditDevice")
		default:
			ps = append(ps, "VirtualMachine.Config.AddRemoveDevice")
		}
	}
	return append(ps, assignedNetworks(spec.DeviceChange)...)
}

// assignedNetworks: a NIC added or edited onto a network needs Network.Assign.
func assignedNetworks(changes []types.BaseVirtualDeviceConfigSpec) []string {
	for _, change := range changes {
		c := change.GetVirtualDeviceConfigSpec()
		if c.Operation == types.VirtualDeviceConfigSpecOperationRemove || c.Device == nil {
			continue
		}
		if _, nic := c.Device.(types.BaseVirtualEthernetCard); nic && c.Device.GetVirtualDevice().Backing != nil {
			return []string{"Network.Assign"}
		}
	}
	return nil
}
