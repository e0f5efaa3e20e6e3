import sys, re, subprocess, collections
log=sys.argv[1]; lo,hi=sys.argv[2],sys.argv[3]
ev=[]; cur=None
for line in open(log, errors='replace'):
    if line.startswith('A '):
        _,p,n,t=line.split(); cur=[ 'A',p,int(n),float(t),[]]
    elif line.startswith('E'):
        ev.append(cur); cur=None
    elif line.startswith('F '):
        _,p,t=line.split(); ev.append(['F',p,0,float(t),None])
    elif line.startswith('M '):
        parts=line.split(); ev.append(['M',' '.join(parts[1:-1]),0,float(parts[-1]),None])
    elif cur is not None:
        m=re.search(r'\((\w*)\+',line); lib=line.split('(')[0].rsplit('/',1)[-1]
        cur[4].append((lib,m.group(1) if m and m.group(1) else line.strip().rsplit('[',1)[0].rsplit('/',1)[-1]))
live={}; tot=0; phase=None; best=(0,None,None); inwin=False
for i,e in enumerate(ev):
    if e[0]=='M':
        phase=e[1]
        if phase==lo: inwin=True
        if phase==hi: inwin=False
        continue
    if e[0]=='A': live[e[1]]=e; tot+=e[2]
    else:
        a=live.pop(e[1],None)
        if a: tot-=a[2]
    if inwin and tot>best[0]: best=(tot,dict(live),i)
tot,snap,idx=best
print('peak live big allocs %.1f MB at event %d'%(tot/2**20,idx))
names=set(f for a in snap.values() for _,f in a[4] if f.startswith('_Z'))
dem=dict(zip(sorted(names), subprocess.run(['c++filt'],input='\n'.join(sorted(names)),capture_output=True,text=True).stdout.split('\n')))
def sig(a):
    out=[]
    for lib,f in a[4]:
        d=dem.get(f,f)
        d=re.sub(r'\(.*','',d)
        if any(k in d for k in ('AlignedMalloc','CPUDeviceStorage','StorageImpl::Alloc','_Znwm','operator new','libc_','std::_Function','ExecuteOprBlock','Bind_simple','ThreadedEngine','_ctypes','ffi')): continue
        out.append(d[:90])
        if len(out)>=3: break
    return ' | '.join(out)
g=collections.defaultdict(lambda:[0,0,collections.Counter()])
for a in snap.values():
    s=sig(a); g[s][0]+=a[2]; g[s][1]+=1; g[s][2][a[2]]+=1
for s,(b,c,sz) in sorted(g.items(),key=lambda x:-x[1][0]):
    print('%8.1f MB %4d  %s\n      sizes(MB):%s'%(b/2**20,c,s,', '.join('%.2fx%d'%(k/2**20,v) for k,v in sz.most_common(6))))
print('--- allocated inside the window, by group')
t0=[e[3] for e in ev if e[0]=='M' and e[1]==lo][0]
g2=collections.defaultdict(lambda:[0,0])
for a in snap.values():
    k=('old ' if a[3]<t0 else 'new ')+sig(a); g2[k][0]+=a[2]; g2[k][1]+=1
for s,(b,c) in sorted(g2.items(),key=lambda x:-x[1][0]): print('%8.1f MB %4d %s'%(b/2**20,c,s))
# timeline of peak phase
marks=[(e[1],e[3]) for e in ev if e[0]=='M']
print(marks)
print('peak time', ev[idx][3])
print('--- old by phase of allocation')
def phase_of(t):
    p='start'
    for m,tm in marks:
        if tm<=t: p='after '+m
    return p
g3=collections.defaultdict(lambda:[0,0,collections.Counter()])
for a in snap.values():
    if a[3]>=t0: continue
    k=phase_of(a[3])+' :: '+sig(a); g3[k][0]+=a[2]; g3[k][1]+=1; g3[k][2][round(a[2]/2**20,2)]+=1
for s,(b,c,sz) in sorted(g3.items()): print('%8.1f MB %4d %s\n     %s'%(b/2**20,c,s,dict(sz.most_common(8))))
